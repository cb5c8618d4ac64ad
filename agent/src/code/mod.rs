//! The code interpreter (issue 11): persistent interpreter contexts.
//!
//! A context is one long-lived interpreter: a driver process for python
//! ([`python`]) and javascript ([`node`]) speaking `PROTOCOL.md`, a session
//! shell for bash ([`bash`]). Ids are 32 hex digits. Each language has a
//! default context, created by its first run without a context id and then
//! reused. Runs on one context take turns (FIFO); contexts run in parallel.
//!
//! Nothing runs until the code interpreter is used: a context's process
//! starts on its first run (bash: on creation). Every context's processes are
//! children of the agent, so their memory counts against the sandbox's
//! limits (they are in its cgroup, or its VM) and they end with the sandbox.
//! [`readiness`] answers the SDK's readiness probe.
pub mod bash;
pub mod driver;
pub mod error;
pub mod events;
pub mod interp;
pub mod language;
pub mod node;
pub mod protocol;
pub mod python;
pub mod readiness;
pub mod run;
pub mod utf8;

use self::bash::BashContext;
use self::error::{CodeError, Result};
use self::events::{CodeTx, Events};
use self::interp::Interp;
use self::language::Language;
use crate::config::AgentConfig;
use crate::session::Sessions;
use pvisor_proto::agent::{code_event::Kind, CodeContext, RunCodeRequest};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

enum Engine {
    Driver(Box<Interp>),
    Bash(BashContext),
}

pub struct Context {
    pub id: String,
    pub language: Language,
    /// Creation order, for listing.
    seq: u64,
    engine: Engine,
}

impl Context {
    pub fn describe(&self) -> CodeContext {
        CodeContext { id: self.id.clone(), language: self.language.name().into() }
    }

    async fn run(&self, req: &RunCodeRequest, ev: &mut Events) {
        match &self.engine {
            Engine::Driver(i) => i.run(&req.code, ev).await,
            Engine::Bash(b) => b.run(&req.code, &req.envs, ev).await,
        }
    }

    fn interrupt(&self) {
        match &self.engine {
            Engine::Driver(i) => i.interrupt(),
            Engine::Bash(b) => b.interrupt(),
        }
    }

    async fn close(&self) {
        match &self.engine {
            Engine::Driver(i) => i.close().await,
            Engine::Bash(b) => b.close().await,
        }
    }
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Arc<Context>>,
    defaults: HashMap<Language, String>,
    next_seq: u64,
}

/// Every context of the sandbox.
pub struct Contexts {
    cfg: Arc<AgentConfig>,
    sessions: Arc<Sessions>,
    table: Mutex<Table>,
    creating_default: Mutex<()>,
}

impl Contexts {
    pub fn new(cfg: Arc<AgentConfig>, sessions: Arc<Sessions>) -> Self {
        Contexts { cfg, sessions, table: Mutex::new(Table::default()), creating_default: Mutex::new(()) }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new context (not registered yet); its interpreter must exist.
    fn build(&self, language: Language, cwd: &str) -> Result<Context> {
        let cwd = crate::spawn::resolve_cwd(&self.cfg, cwd)?;
        if !std::path::Path::new(&cwd).is_dir() {
            let e = crate::error::AgentError::InvalidArgument(format!("working directory {cwd} does not exist"));
            return Err(e.into());
        }
        let engine = match language {
            Language::Python => {
                Engine::Driver(Box::new(Interp::new(self.cfg.clone(), python::driver_spec(&self.cfg, &cwd)?)))
            }
            Language::JavaScript => {
                Engine::Driver(Box::new(Interp::new(self.cfg.clone(), node::driver_spec(&self.cfg, &cwd)?)))
            }
            Language::Bash => {
                language.interpreter(&self.cfg)?;
                Engine::Bash(BashContext::create(self.sessions.clone(), &cwd)?)
            }
        };
        Ok(Context { id: crate::commands::new_id(), language, seq: 0, engine })
    }

    fn register(&self, mut ctx: Context, default: bool) -> Arc<Context> {
        let mut t = self.table();
        ctx.seq = t.next_seq;
        t.next_seq += 1;
        let ctx = Arc::new(ctx);
        t.by_id.insert(ctx.id.clone(), ctx.clone());
        if default {
            t.defaults.insert(ctx.language, ctx.id.clone());
        }
        ctx
    }

    pub fn create(&self, language: &str, cwd: &str) -> Result<CodeContext> {
        let ctx = self.build(Language::parse(language)?, cwd)?;
        Ok(self.register(ctx, false).describe())
    }

    pub fn get(&self, id: &str) -> Result<Arc<Context>> {
        self.table().by_id.get(id).cloned().ok_or_else(|| CodeError::NotFound(id.to_string()))
    }

    /// The language's default context, created on first use.
    fn default_for(&self, language: Language) -> Result<Arc<Context>> {
        // Held across the check and the build, so two first runs make one
        // default context.
        let _one = self.creating_default.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = self.existing_default(language) {
            return Ok(c);
        }
        let ctx = self.build(language, "")?;
        Ok(self.register(ctx, true))
    }

    fn existing_default(&self, language: Language) -> Option<Arc<Context>> {
        let t = self.table();
        t.defaults.get(&language).and_then(|id| t.by_id.get(id)).cloned()
    }

    /// Contexts of `language` (all when empty), oldest first; an unknown
    /// language has none.
    pub fn list(&self, language: &str) -> Vec<CodeContext> {
        let want = if language.is_empty() {
            None
        } else {
            match Language::parse(language) {
                Ok(l) => Some(l),
                Err(_) => return Vec::new(),
            }
        };
        let t = self.table();
        let mut v: Vec<_> = t.by_id.values().filter(|c| want.is_none_or(|l| c.language == l)).collect();
        v.sort_by_key(|c| c.seq);
        v.into_iter().map(|c| c.describe()).collect()
    }

    pub async fn delete(&self, id: &str) -> Result<()> {
        let ctx = {
            let mut t = self.table();
            let ctx = t.by_id.remove(id).ok_or_else(|| CodeError::NotFound(id.to_string()))?;
            if t.defaults.get(&ctx.language).is_some_and(|d| d == id) {
                t.defaults.remove(&ctx.language);
            }
            ctx
        };
        ctx.close().await;
        Ok(())
    }

    /// Deletes every context of `language` (all when empty; none for an
    /// unknown language).
    pub async fn delete_language(&self, language: &str) -> Result<()> {
        for c in self.list(language) {
            match self.delete(&c.id).await {
                Ok(()) | Err(CodeError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Starts a run: resolves (or creates) its context now, so errors come
    /// before the stream; the run itself goes on in a task of its own and a
    /// client that goes away does not stop it.
    pub fn run(self: &Arc<Self>, req: RunCodeRequest, tx: CodeTx) -> Result<()> {
        let ctx = if req.context_id.is_empty() {
            self.default_for(Language::parse(&req.language)?)?
        } else {
            self.get(&req.context_id)?
        };
        tokio::spawn(async move {
            let mut ev = Events::new(tx);
            ev.send(Kind::Init(ctx.id.clone())).await;
            ctx.run(&req, &mut ev).await;
        });
        Ok(())
    }

    pub fn interrupt(&self, id: &str) -> Result<()> {
        self.get(id)?.interrupt();
        Ok(())
    }
}
