"""A sandbox's worker socket, driven through server reflection by Google's client.

What grpcurl does (`grpcurl -plaintext -unix SOCK list | describe | SERVICE/METHOD`), with
grpcio-reflection from PyPI and no generated stubs: the services are listed over the
reflection service, a method's file descriptor is fetched by symbol, and the request and reply
classes are built from the reflected descriptors with protobuf's message factory. The calls go
to the worker's own service and, through its verbatim forwarder, to the agent inside the
sandbox.
"""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

WORKER = "pvisor.worker.v1.Worker"
AGENT = "pvisor.agent.v1.Agent"
MEMORY = 256 << 20  # the conftest sandbox's memory limit


def worker_socket(server, sid: str) -> str:
    """The worker's socket, from the sandbox's durable record (as an operator finds it)."""
    record = json.loads((server.data_dir / "state" / "sandboxes" / f"{sid}.json").read_text())
    return record["worker"]["socket"]


@pytest.fixture
def reflected(server, sandbox_id):
    # gRPC C-core names a Unix socket's path as the HTTP/2 :authority, which hyper (tonic)
    # refuses as malformed (RST_STREAM PROTOCOL_ERROR); grpcurl and grpc-go send "localhost".
    options = [("grpc.default_authority", "localhost")]
    with grpc.insecure_channel(f"unix:{worker_socket(server, sandbox_id)}", options=options) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        yield channel, db, descriptor_pool.DescriptorPool(db)


def call(channel, pool, method_name: str, **fields):
    """Calls METHOD (full name) with a request built from its reflected descriptor."""
    method = pool.FindMethodByName(method_name)
    request_cls = message_factory.GetMessageClass(method.input_type)
    reply_cls = message_factory.GetMessageClass(method.output_type)
    stub = channel.unary_unary(
        f"/{method.containing_service.full_name}/{method.name}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=reply_cls.FromString,
    )
    return stub(request_cls(**fields), timeout=30)


def test_list_services(reflected):
    _, db, _ = reflected
    services = set(db.get_services())
    assert {WORKER, AGENT} <= services, services


def test_describe_method_by_symbol(reflected):
    _, db, pool = reflected
    fd = db.FindFileContainingSymbol(WORKER)
    assert isinstance(fd, FileDescriptorProto) and fd.package == "pvisor.worker.v1", fd.name
    service = pool.FindServiceByName(WORKER)
    assert {"Ready", "Metrics", "Pause", "Resume", "Shutdown"} <= {m.name for m in service.methods}
    metrics = pool.FindMethodByName(f"{WORKER}.Metrics")
    assert metrics.input_type.full_name == "pvisor.worker.v1.Empty"
    assert metrics.output_type.full_name == "pvisor.worker.v1.MetricsReply"
    assert {"cpu_count", "cpu_used_pct", "mem_total_bytes", "mem_used_bytes"} <= set(metrics.output_type.fields_by_name)
    exec_ = pool.FindMethodByName(f"{AGENT}.Exec")
    assert exec_.server_streaming, "Agent.Exec streams its output"
    with pytest.raises(KeyError):
        pool.FindMethodByName(f"{WORKER}.NoSuchMethod")


def test_call_worker_methods(reflected):
    channel, _, pool = reflected
    ready = call(channel, pool, f"{WORKER}.Ready")
    assert ready.backend == "ns"
    assert ready.agent_version
    metrics = call(channel, pool, f"{WORKER}.Metrics")
    assert metrics.mem_total_bytes == MEMORY, metrics
    assert 0 < metrics.mem_used_bytes <= MEMORY, metrics
    assert metrics.cpu_count >= 1, metrics


def test_call_agent_through_the_worker(reflected):
    channel, _, pool = reflected
    ready = call(channel, pool, f"{WORKER}.Ready")
    ping = call(channel, pool, f"{AGENT}.Ping")
    assert ping.version == ready.agent_version
    assert ping.pid == 1, "the agent is the sandbox's init"


def test_unknown_method_is_unimplemented(reflected):
    channel, _, _ = reflected
    stub = channel.unary_unary(f"/{WORKER}/NoSuchMethod", request_serializer=bytes, response_deserializer=bytes)
    with pytest.raises(grpc.RpcError) as ei:
        stub(b"", timeout=30)
    assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED, ei.value
