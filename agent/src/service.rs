//! The `pvisor.agent.v1.Agent` gRPC service: a thin mapping onto
//! [`commands`](crate::commands), [`session`](crate::session),
//! [`files`](crate::files) (as another identity: [`identity`](crate::identity)),
//! [`tunnel`](crate::tunnel) and the code interpreter ([`code`](crate::code)).
use crate::code::Contexts;
use crate::commands::Commands;
use crate::config::AgentConfig;
use crate::files;
use crate::hooks;
use crate::identity::{Identity, Scope, SESSION_KEY};
use crate::isolated::Isolation;
use crate::line_window::{self, LineWindow};
use crate::session::Sessions;
use pvisor_proto::agent::agent_server::Agent;
use pvisor_proto::agent::*;
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

const CHUNK: usize = 256 * 1024;

/// What exists once the worker has configured the agent.
pub struct Configured {
    pub config: Arc<AgentConfig>,
    pub commands: Arc<Commands>,
    pub sessions: Arc<Sessions>,
    pub code: Arc<Contexts>,
    pub isolation: Arc<Isolation>,
    /// How starting the sandbox went (the pre-start hook, then the periodic
    /// hooks and the entrypoint); None while it is going.
    started: watch::Receiver<Option<Result<(), Status>>>,
}

/// The service. It starts unconfigured: until `Configure` arrives only
/// `Ping` and `Configure` answer; everything else is FAILED_PRECONDITION.
/// The state is shared by every connection, so a reconnecting worker finds
/// the commands and sessions it left.
#[derive(Clone, Default)]
pub struct AgentService {
    state: Arc<OnceLock<Configured>>,
    /// The agent's end of its isolator's socket, until configured.
    isolator: Arc<std::sync::Mutex<Option<std::os::fd::OwnedFd>>>,
}

impl AgentService {
    pub fn new() -> Self {
        Self::default()
    }

    /// A service whose isolated sessions are built by the isolator at the
    /// other end of `isolator` ([`crate::isolated::isolator`]).
    pub fn with_isolator(isolator: Option<std::os::fd::OwnedFd>) -> Self {
        AgentService { isolator: Arc::new(std::sync::Mutex::new(isolator)), ..Self::default() }
    }

    /// The configured state, or the status every call but Ping/Configure
    /// gets before `Configure`.
    pub fn configured(&self) -> Result<&Configured, Status> {
        self.state.get().ok_or_else(|| Status::failed_precondition("the agent is not configured yet (Agent.Configure)"))
    }

    /// Applies `cfg` if this is the first configuration, then starts the
    /// sandbox (see [`start`]); returns whether it was applied, once the
    /// start has ended. A repeated identical configuration waits for the
    /// first one's start and answers its outcome; a different one is refused.
    pub async fn configure(&self, cfg: AgentConfig) -> Result<bool, Status> {
        let mut applied = false;
        let (done, started) = watch::channel(None);
        let state = self.state.get_or_init(|| {
            applied = true;
            let config = Arc::new(cfg.clone());
            let sessions = Arc::new(Sessions::new(config.clone()));
            let isolator = self.isolator.lock().unwrap_or_else(|e| e.into_inner()).take();
            Configured {
                commands: Commands::new(config.clone()),
                code: Arc::new(Contexts::new(config.clone(), sessions.clone())),
                isolation: Isolation::new(config.clone(), isolator),
                sessions,
                config,
                started,
            }
        });
        if !applied {
            if *state.config != cfg {
                return Err(Status::failed_precondition("the agent was already configured differently"));
            }
        } else {
            // Inside the sandbox now (its network namespace, or the guest).
            crate::code::readiness::spawn();
            // A task of its own: a caller that goes away (a worker
            // reconnecting) must not cut the start short.
            let (commands, config) = (state.commands.clone(), state.config.clone());
            tokio::spawn(async move {
                let outcome = start(&commands, &config).await;
                done.send_replace(Some(outcome));
            });
        }
        let mut started = state.started.clone();
        let outcome = started
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Status::internal("the sandbox's start was abandoned"))?
            .clone()
            .unwrap_or(Ok(()));
        outcome.map(|()| applied)
    }
    fn commands(&self) -> Result<&Arc<Commands>, Status> {
        Ok(&self.configured()?.commands)
    }

    fn sessions(&self) -> Result<&Arc<Sessions>, Status> {
        Ok(&self.configured()?.sessions)
    }

    fn code(&self) -> Result<&Arc<Contexts>, Status> {
        Ok(&self.configured()?.code)
    }

    fn isolation(&self) -> Result<&Arc<Isolation>, Status> {
        Ok(&self.configured()?.isolation)
    }

    /// Where a file call runs: the metadata may name another identity, or an
    /// isolated session (its root, as its identity).
    fn scope(&self, md: &tonic::metadata::MetadataMap) -> Result<Scope, Status> {
        let who = Identity::from_metadata(md)?;
        let Some(v) = md.get(SESSION_KEY) else {
            return Ok(Scope { who, root: None });
        };
        let id = v.to_str().map_err(|_| Status::invalid_argument(format!("{SESSION_KEY} is not text")))?;
        let s = self.isolation()?.get(id)?;
        s.check_active()?;
        let who = (s.uid != 0 || s.gid != 0).then_some(Identity { uid: s.uid, gid: s.gid });
        Ok(Scope { who, root: Some(s.root.clone()) })
    }
}

/// Starts the sandbox: the pre-start hook, and once it succeeded the
/// periodic hooks and the entrypoint. A failed pre-start hook starts nothing.
async fn start(commands: &Arc<Commands>, cfg: &AgentConfig) -> Result<(), Status> {
    let lifecycle = cfg.lifecycle.clone().unwrap_or_default();
    if let Some(hook) = &lifecycle.pre_start {
        let outcome = hooks::run(commands, hook).await;
        if !outcome.succeeded() {
            tracing::warn!("the pre-start hook {:?} {}", hook.command, outcome.describe(hook.timeout_secs));
            return Err(hooks::pre_start_failure(hook, &outcome));
        }
    }
    hooks::periodic::start(commands, &lifecycle.periodic);
    if !cfg.entrypoint.is_empty() {
        let req = ExecRequest { argv: cfg.entrypoint.clone(), background: true, ..Default::default() };
        let (tx, _rx) = mpsc::channel(1);
        if let Err(e) = commands.exec(req, tx, Some("entrypoint".into())) {
            tracing::warn!("entrypoint {:?} did not start: {e}", cfg.entrypoint);
        }
    }
    Ok(())
}

fn ping_reply() -> PingReply {
    PingReply { version: env!("CARGO_PKG_VERSION").into(), pid: std::process::id() }
}

type Res<T> = Result<Response<T>, Status>;
type Stream<T> = ReceiverStream<Result<T, Status>>;

#[tonic::async_trait]
impl Agent for AgentService {
    async fn ping(&self, _: Request<Empty>) -> Res<PingReply> {
        Ok(Response::new(ping_reply()))
    }

    async fn configure(&self, req: Request<AgentConfig>) -> Res<PingReply> {
        AgentService::configure(self, req.into_inner()).await?;
        Ok(Response::new(ping_reply()))
    }

    async fn refresh(&self, req: Request<RefreshRequest>) -> Res<Empty> {
        let req = req.into_inner();
        match tokio::task::spawn_blocking(move || crate::guest::refresh::apply(req)).await {
            Ok(Ok(())) => Ok(Response::new(Empty {})),
            Ok(Err(None)) => {
                Err(Status::failed_precondition("only a vm guest's agent refreshes its clock and identity"))
            }
            Ok(Err(Some(e))) => Err(Status::internal(e)),
            Err(e) => Err(Status::internal(e.to_string())),
        }
    }

    type ExecStream = Stream<ExecEvent>;
    async fn exec(&self, req: Request<ExecRequest>) -> Res<Self::ExecStream> {
        self.configured()?;
        let (tx, rx) = mpsc::channel(256);
        self.commands()?.exec(req.into_inner(), tx, None)?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn command_status(&self, req: Request<CommandRef>) -> Res<CommandStatusReply> {
        self.configured()?;
        Ok(Response::new(self.commands()?.status(&req.into_inner().id)?))
    }

    async fn command_logs(&self, req: Request<LogsRequest>) -> Res<LogsReply> {
        self.configured()?;
        let r = req.into_inner();
        Ok(Response::new(self.commands()?.logs(&r.id, r.cursor)?))
    }

    async fn interrupt(&self, req: Request<CommandRef>) -> Res<Empty> {
        self.configured()?;
        self.commands()?.interrupt(&req.into_inner().id)?;
        Ok(Response::new(Empty {}))
    }

    async fn create_session(&self, req: Request<CreateSessionRequest>) -> Res<SessionRef> {
        self.configured()?;
        let id = self.sessions()?.create(&req.into_inner().cwd)?;
        Ok(Response::new(SessionRef { id }))
    }

    type RunInSessionStream = Stream<ExecEvent>;
    async fn run_in_session(&self, req: Request<SessionRunRequest>) -> Res<Self::RunInSessionStream> {
        self.configured()?;
        let r = req.into_inner();
        let (tx, rx) = mpsc::channel(256);
        let sessions = self.sessions()?.clone();
        // Fail fast on an unknown session, before the stream starts.
        sessions.run_check(&r.session_id)?;
        tokio::spawn(async move {
            let err_tx = tx.clone();
            if let Err(e) = sessions.run(&r.session_id, &r.command, &r.cwd, r.timeout_ms, tx).await {
                let _ = err_tx.send(Err(e.into())).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delete_session(&self, req: Request<SessionRef>) -> Res<Empty> {
        self.configured()?;
        self.sessions()?.delete(&req.into_inner().id).await?;
        Ok(Response::new(Empty {}))
    }

    async fn stat(&self, req: Request<PathsRequest>) -> Res<FileList> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let paths = req.into_inner().paths;
        let files = scope.run(move || files::stat(&paths)).await?;
        Ok(Response::new(FileList { files }))
    }

    async fn upload(&self, req: Request<Streaming<UploadChunk>>) -> Res<Empty> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let mut inbound = req.into_inner();
        let mut current: Option<files::UploadFile> = None;
        let result: Result<(), Status> = async {
            while let Some(chunk) = inbound.message().await? {
                match chunk.kind {
                    Some(upload_chunk::Kind::Header(h)) => {
                        if let Some(f) = current.take() {
                            scope.run(move || f.finish()).await?;
                        }
                        current = Some(
                            scope.run(move || files::UploadFile::create(&h.path, h.mode, h.owner, h.group)).await?,
                        );
                    }
                    Some(upload_chunk::Kind::Data(d)) => {
                        let mut f = current.take().ok_or_else(|| Status::invalid_argument("data before header"))?;
                        // Writes go to the open file: no permission check left to make.
                        // A failed write (ENOSPC past the disk bound) puts the file back
                        // for the abort below (a partial upload would hold the space
                        // until the sandbox ends).
                        let (f, wrote) = tokio::task::spawn_blocking(move || {
                            let r = f.write(&d);
                            (f, r)
                        })
                        .await
                        .map_err(|e| Status::internal(e.to_string()))?;
                        current = Some(f);
                        wrote?;
                    }
                    None => {}
                }
            }
            if let Some(f) = current.take() {
                scope.run(move || f.finish()).await?;
            }
            Ok(())
        }
        .await;
        if let (Err(_), Some(f)) = (&result, current.take()) {
            // In the scope the file was made in (an isolated session's root).
            let _ = scope
                .run(move || {
                    f.abort();
                    Ok(())
                })
                .await;
        }
        result.map(|_| Response::new(Empty {}))
    }

    type DownloadStream = Stream<DataChunk>;
    async fn download(&self, req: Request<DownloadRequest>) -> Res<Self::DownloadStream> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let r = req.into_inner();
        if let Some(lines) = r.lines {
            let window = LineWindow::new(lines.first, lines.count)?;
            let (file, _) = scope.run(move || files::open_for_read(&r.path, 0, 0)).await?;
            return Ok(Response::new(line_window::send(file, window)));
        }
        let (mut file, mut left) = scope.run(move || files::open_for_read(&r.path, r.offset, r.limit)).await?;
        let (tx, rx) = mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            while left > 0 {
                let want = (left as usize).min(CHUNK);
                match files::read_chunk(&mut file, want) {
                    Ok(data) if data.is_empty() => break,
                    Ok(data) => {
                        left -= data.len() as u64;
                        if tx.blocking_send(Ok(DataChunk { data })).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e.into()));
                        break;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn remove_files(&self, req: Request<PathsRequest>) -> Res<Empty> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let paths = req.into_inner().paths;
        scope.run(move || files::remove_files(&paths)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn r#move(&self, req: Request<MoveRequest>) -> Res<Empty> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let moves = req.into_inner().moves;
        scope.run(move || moves.iter().try_for_each(|m| files::rename(&m.src, &m.dest))).await?;
        Ok(Response::new(Empty {}))
    }

    async fn set_permissions(&self, req: Request<PermissionsRequest>) -> Res<Empty> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let e = req.into_inner().entries;
        scope.run(move || files::set_permissions(&e)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn search(&self, req: Request<SearchRequest>) -> Res<FileList> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let r = req.into_inner();
        let files = scope.run(move || files::search(&r.path, &r.pattern)).await?;
        Ok(Response::new(FileList { files }))
    }

    async fn replace(&self, req: Request<ReplaceRequest>) -> Res<ReplaceReply> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let e = req.into_inner().entries;
        let counts = scope.run(move || files::replace(&e)).await?;
        Ok(Response::new(ReplaceReply { counts }))
    }

    async fn make_dirs(&self, req: Request<PermissionsRequest>) -> Res<Empty> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let e = req.into_inner().entries;
        scope.run(move || files::make_dirs(&e)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn list_dir(&self, req: Request<ListDirRequest>) -> Res<FileList> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let r = req.into_inner();
        let files = scope.run(move || files::list_dir(&r.path, r.depth)).await?;
        Ok(Response::new(FileList { files }))
    }

    async fn remove_dirs(&self, req: Request<PathsRequest>) -> Res<Empty> {
        self.configured()?;
        let scope = self.scope(req.metadata())?;
        let paths = req.into_inner().paths;
        scope.run(move || files::remove_dirs(&paths)).await?;
        Ok(Response::new(Empty {}))
    }

    type PtyStream = Stream<PtyOutput>;
    async fn pty(&self, req: Request<Streaming<PtyInput>>) -> Res<Self::PtyStream> {
        let cfg = self.configured()?.config.clone();
        let (tx, rx) = mpsc::channel(64);
        crate::pty::open(&cfg, req.into_inner(), tx).await?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type TunnelStream = Stream<TunnelData>;
    async fn tunnel(&self, req: Request<Streaming<TunnelData>>) -> Res<Self::TunnelStream> {
        self.configured()?;
        let (tx, rx) = mpsc::channel(16);
        crate::tunnel::open(req.into_inner(), tx).await?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    // Code interpreter (issue 11): `crate::code`.
    async fn create_context(&self, req: Request<CreateContextRequest>) -> Res<CodeContext> {
        let r = req.into_inner();
        Ok(Response::new(self.code()?.create(&r.language, &r.cwd)?))
    }

    async fn get_context(&self, req: Request<ContextRef>) -> Res<CodeContext> {
        Ok(Response::new(self.code()?.get(&req.into_inner().id)?.describe()))
    }

    async fn list_contexts(&self, req: Request<ListContextsRequest>) -> Res<ContextList> {
        Ok(Response::new(ContextList { contexts: self.code()?.list(&req.into_inner().language) }))
    }

    async fn delete_context(&self, req: Request<ContextRef>) -> Res<Empty> {
        self.code()?.delete(&req.into_inner().id).await?;
        Ok(Response::new(Empty {}))
    }

    async fn delete_contexts(&self, req: Request<ListContextsRequest>) -> Res<Empty> {
        self.code()?.delete_language(&req.into_inner().language).await?;
        Ok(Response::new(Empty {}))
    }

    type RunCodeStream = Stream<CodeEvent>;
    async fn run_code(&self, req: Request<RunCodeRequest>) -> Res<Self::RunCodeStream> {
        let (tx, rx) = mpsc::channel(64);
        self.code()?.run(req.into_inner(), tx)?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn interrupt_code(&self, req: Request<ContextRef>) -> Res<Empty> {
        self.code()?.interrupt(&req.into_inner().id)?;
        Ok(Response::new(Empty {}))
    }

    // Isolated sessions (OSEP-0013): `crate::isolated`.
    async fn isolation_capabilities(&self, _: Request<Empty>) -> Res<IsolationCaps> {
        Ok(Response::new(self.isolation()?.capabilities().await))
    }

    async fn create_isolated_session(&self, req: Request<IsolatedSessionSpec>) -> Res<IsolatedSession> {
        Ok(Response::new(self.isolation()?.create(req.into_inner()).await?))
    }

    async fn get_isolated_session(&self, req: Request<IsolatedSessionRef>) -> Res<IsolatedSession> {
        let iso = self.isolation()?;
        let s = iso.get(&req.into_inner().id)?;
        Ok(Response::new(iso.describe(&s)))
    }

    async fn list_isolated_sessions(&self, _: Request<Empty>) -> Res<IsolatedSessionList> {
        Ok(Response::new(IsolatedSessionList { sessions: self.isolation()?.list() }))
    }

    async fn delete_isolated_session(&self, req: Request<IsolatedSessionRef>) -> Res<Empty> {
        self.isolation()?.delete(&req.into_inner().id).await?;
        Ok(Response::new(Empty {}))
    }

    type RunIsolatedStream = Stream<ExecEvent>;
    async fn run_isolated(&self, req: Request<IsolatedRunRequest>) -> Res<Self::RunIsolatedStream> {
        let r = req.into_inner();
        let s = self.isolation()?.get(&r.session_id)?;
        // Refused before the stream starts: a dead session, no code, a bad variable name.
        s.check_active()?;
        crate::isolated::session::check_run(&r)?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let err_tx = tx.clone();
            let envs = r.envs.into_iter().collect();
            if let Err(e) = s.run(&r.code, &envs, r.timeout_ms, tx).await {
                let _ = err_tx.send(Err(e.into())).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn start_isolated_run(&self, req: Request<IsolatedRunRequest>) -> Res<IsolatedRun> {
        let r = req.into_inner();
        let s = self.isolation()?.get(&r.session_id)?;
        crate::isolated::session::check_run(&r)?;
        let envs = r.envs.into_iter().collect();
        Ok(Response::new(s.start_run(&r.code, &envs).await?))
    }

    async fn get_isolated_run(&self, req: Request<IsolatedRunRef>) -> Res<IsolatedRun> {
        let r = req.into_inner();
        let s = self.isolation()?.get(&r.session_id)?;
        let run = s.run_by_id(&r.run_id)?;
        Ok(Response::new(s.describe_run(&run)))
    }

    async fn isolated_run_logs(&self, req: Request<IsolatedRunLogsRequest>) -> Res<IsolatedRunLogsReply> {
        let r = req.into_inner();
        let run = self.isolation()?.get(&r.session_id)?.run_by_id(&r.run_id)?;
        let (data, cursor) = run.logs(r.cursor);
        Ok(Response::new(IsolatedRunLogsReply { data, cursor }))
    }
}
