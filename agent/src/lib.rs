//! pvisor-agent: the init process of every sandbox.
//!
//! The agent is started by the worker's backend as PID 1 of the sandbox (the
//! ns backend's namespace jail today, a microVM's init later). It serves the
//! `pvisor.agent.v1.Agent` gRPC service over one inherited stream, reaps
//! orphans, runs commands and sessions, does file operations and tunnels TCP
//! connections to ports inside the sandbox, and serves the code
//! interpreter's persistent contexts ([`code`]).
//!
//! The sandbox's root *is* the agent's `/`: the backend pivot_roots before the
//! agent starts, so no path, `..` or symlink the agent follows can leave it.

pub mod code;
pub mod commands;
pub mod config;
pub mod envfile;
pub mod error;
pub mod expand;
pub mod files;
pub mod guest;
pub mod hooks;
pub mod identity;
pub mod isolated;
pub mod line_window;
pub mod lines;
pub mod passwd;
pub mod pty;
pub mod reaper;
pub mod server;
pub mod service;
pub mod session;
pub mod shell;
pub mod spawn;
pub mod tree_ops;
pub mod tunnel;
pub mod workdir;
