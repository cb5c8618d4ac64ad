//! Forwards the agent's gRPC service verbatim: every call to
//! `/pvisor.agent.v1.Agent/*` on the worker's socket is relayed, streams and
//! all, over the backend's connection to the agent.
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::Channel;
use tower::{Service, ServiceExt};

#[derive(Clone)]
pub struct AgentForward {
    channel: Channel,
}

impl AgentForward {
    pub fn new(channel: Channel) -> Self {
        AgentForward { channel }
    }
}

impl NamedService for AgentForward {
    const NAME: &'static str = pvisor_proto::AGENT_SERVICE;
}

impl Service<http::Request<Body>> for AgentForward {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let channel = self.channel.clone();
        Box::pin(async move {
            match channel.oneshot(req).await {
                Ok(resp) => Ok(resp),
                Err(e) => Ok(tonic::Status::unavailable(format!("sandbox agent unreachable: {e}")).into_http()),
            }
        })
    }
}
