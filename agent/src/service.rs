//! The `pvisor.agent.v1.Agent` gRPC service: a thin mapping onto
//! [`commands`](crate::commands), [`session`](crate::session),
//! [`files`](crate::files) (as another identity: [`identity`](crate::identity)),
//! [`tunnel`](crate::tunnel) and the code interpreter ([`code`](crate::code)).
use crate::code::Contexts;
use crate::commands::Commands;
use crate::config::AgentConfig;
use crate::files;
use crate::hooks;
use crate::identity::{blocking_as, Identity};
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
}

impl AgentService {
    pub fn new() -> Self {
        Self::default()
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
            Configured {
                commands: Commands::new(config.clone()),
                code: Arc::new(Contexts::new(config.clone(), sessions.clone())),
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
        let who = Identity::from_metadata(req.metadata())?;
        let paths = req.into_inner().paths;
        let files = blocking_as(who, move || files::stat(&paths)).await?;
        Ok(Response::new(FileList { files }))
    }

    async fn upload(&self, req: Request<Streaming<UploadChunk>>) -> Res<Empty> {
        self.configured()?;
        let who = Identity::from_metadata(req.metadata())?;
        let mut inbound = req.into_inner();
        let mut current: Option<files::UploadFile> = None;
        let result: Result<(), Status> = async {
            while let Some(chunk) = inbound.message().await? {
                match chunk.kind {
                    Some(upload_chunk::Kind::Header(h)) => {
                        if let Some(f) = current.take() {
                            blocking_as(who, move || f.finish()).await?;
                        }
                        current = Some(
                            blocking_as(who, move || files::UploadFile::create(&h.path, h.mode, h.owner, h.group))
                                .await?,
                        );
                    }
                    Some(upload_chunk::Kind::Data(d)) => {
                        let mut f = current.take().ok_or_else(|| Status::invalid_argument("data before header"))?;
                        // Writes go to the open file: no permission check left to make.
                        // A failed write (ENOSPC past the disk bound) removes the temporary
                        // file here: the file is gone from `current`, so the abort below
                        // cannot (a partial upload would hold the space until the sandbox ends).
                        current = Some(
                            blocking_as(None, move || match f.write(&d) {
                                Ok(()) => Ok(f),
                                Err(e) => {
                                    f.abort();
                                    Err(e)
                                }
                            })
                            .await?,
                        );
                    }
                    None => {}
                }
            }
            if let Some(f) = current.take() {
                blocking_as(who, move || f.finish()).await?;
            }
            Ok(())
        }
        .await;
        if let (Err(_), Some(f)) = (&result, current.take()) {
            f.abort();
        }
        result.map(|_| Response::new(Empty {}))
    }

    type DownloadStream = Stream<DataChunk>;
    async fn download(&self, req: Request<DownloadRequest>) -> Res<Self::DownloadStream> {
        self.configured()?;
        let who = Identity::from_metadata(req.metadata())?;
        let r = req.into_inner();
        if let Some(lines) = r.lines {
            let window = LineWindow::new(lines.first, lines.count)?;
            let (file, _) = blocking_as(who, move || files::open_for_read(&r.path, 0, 0)).await?;
            return Ok(Response::new(line_window::send(file, window)));
        }
        let (mut file, mut left) = blocking_as(who, move || files::open_for_read(&r.path, r.offset, r.limit)).await?;
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
        let who = Identity::from_metadata(req.metadata())?;
        let paths = req.into_inner().paths;
        blocking_as(who, move || files::remove_files(&paths)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn r#move(&self, req: Request<MoveRequest>) -> Res<Empty> {
        self.configured()?;
        let who = Identity::from_metadata(req.metadata())?;
        let moves = req.into_inner().moves;
        blocking_as(who, move || moves.iter().try_for_each(|m| files::rename(&m.src, &m.dest))).await?;
        Ok(Response::new(Empty {}))
    }

    async fn set_permissions(&self, req: Request<PermissionsRequest>) -> Res<Empty> {
        self.configured()?;
        let who = Identity::from_metadata(req.metadata())?;
        let e = req.into_inner().entries;
        blocking_as(who, move || files::set_permissions(&e)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn search(&self, req: Request<SearchRequest>) -> Res<FileList> {
        self.configured()?;
        let who = Identity::from_metadata(req.metadata())?;
        let r = req.into_inner();
        let files = blocking_as(who, move || files::search(&r.path, &r.pattern)).await?;
        Ok(Response::new(FileList { files }))
    }

    async fn replace(&self, req: Request<ReplaceRequest>) -> Res<ReplaceReply> {
        self.configured()?;
        let who = Identity::from_metadata(req.metadata())?;
        let e = req.into_inner().entries;
        let counts = blocking_as(who, move || files::replace(&e)).await?;
        Ok(Response::new(ReplaceReply { counts }))
    }

    async fn make_dirs(&self, req: Request<PermissionsRequest>) -> Res<Empty> {
        self.configured()?;
        let who = Identity::from_metadata(req.metadata())?;
        let e = req.into_inner().entries;
        blocking_as(who, move || files::make_dirs(&e)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn list_dir(&self, req: Request<ListDirRequest>) -> Res<FileList> {
        self.configured()?;
        let who = Identity::from_metadata(req.metadata())?;
        let r = req.into_inner();
        let files = blocking_as(who, move || files::list_dir(&r.path, r.depth)).await?;
        Ok(Response::new(FileList { files }))
    }

    async fn remove_dirs(&self, req: Request<PathsRequest>) -> Res<Empty> {
        self.configured()?;
        let who = Identity::from_metadata(req.metadata())?;
        let paths = req.into_inner().paths;
        blocking_as(who, move || files::remove_dirs(&paths)).await?;
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
}
