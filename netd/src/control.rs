//! The control socket (fd 3, SOCK_SEQPACKET): one `NetdControl` per message
//! from the worker, one `NetdReply` per message back. `start` brings the
//! link's fd in SCM_RIGHTS and comes once; netd exits when the socket closes.
use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use prost::Message;
use pvisor_proto::net::{netd_control, NetConfig, NetdControl, NetdReply};

use crate::error::Error;
use crate::judge::JudgeFactory;
use crate::stack::Stack;

/// Largest control message (a policy of 4,096 rules fits easily).
const MAX_MESSAGE: usize = 1 << 20;

pub struct Control {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl Control {
    pub fn new(fd: OwnedFd) -> Control {
        Control { fd, buf: vec![0; MAX_MESSAGE] }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The next message and the fd it carried: `Ok(None)` when the socket is
    /// closed, `Err` with `would_block` when `nonblocking` and nothing waits.
    pub fn recv(&mut self, nonblocking: bool) -> Result<Received, Error> {
        let flags = if nonblocking { MsgFlags::MSG_DONTWAIT } else { MsgFlags::empty() } | MsgFlags::MSG_CMSG_CLOEXEC;
        let mut space = nix::cmsg_space!([RawFd; 2]);
        let mut iov = [IoSliceMut::new(&mut self.buf)];
        let msg = loop {
            match recvmsg::<()>(self.fd.as_raw_fd(), &mut iov, Some(&mut space), flags) {
                Ok(m) => break m,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Ok(Received::Nothing),
                Err(e) => return Err(Error::Control(format!("recvmsg: {e}"))),
            }
        };
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(|e| Error::Control(format!("control messages: {e}")))? {
            if let ControlMessageOwned::ScmRights(rights) = c {
                for fd in rights {
                    // SAFETY: SCM_RIGHTS just installed this fd in our table; nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        let n = msg.bytes;
        if n == 0 && fds.is_empty() {
            return Ok(Received::Closed);
        }
        if msg.flags.contains(MsgFlags::MSG_TRUNC) {
            return Err(Error::Control("message larger than 1 MiB".into()));
        }
        let m = NetdControl::decode(&self.buf[..n]).map_err(|e| Error::Control(format!("decode: {e}")))?;
        Ok(Received::Message(m, fds.into_iter().next()))
    }

    pub fn reply(&self, r: &NetdReply) -> Result<(), Error> {
        let bytes = r.encode_to_vec();
        let iov = [IoSlice::new(&bytes)];
        let cmsgs: [ControlMessage<'_>; 0] = [];
        loop {
            match sendmsg::<()>(self.fd.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(Error::Control(format!("sendmsg: {e}"))),
            }
        }
    }
}

pub enum Received {
    Message(NetdControl, Option<OwnedFd>),
    Nothing,
    Closed,
}

fn error_reply(e: impl ToString) -> NetdReply {
    NetdReply { error: e.to_string(), stats: None }
}

/// Serves the control socket: waits for `start`, runs the stack, answers
/// `policy` and `stats`, returns when the control socket (or the link) closes.
pub fn serve(mut control: Control, judges: &dyn JudgeFactory, fallback_dns: &[SocketAddr]) -> Result<(), Error> {
    let (mut stack, mut config) = loop {
        let (msg, fd) = match control.recv(false)? {
            Received::Closed => return Ok(()),
            Received::Nothing => continue,
            Received::Message(m, fd) => (m, fd),
        };
        match msg.msg {
            Some(netd_control::Msg::Start(start)) => {
                let Some(link) = fd else {
                    control.reply(&error_reply("start carries no link fd"))?;
                    continue;
                };
                let config = start.config.unwrap_or_default();
                let made = judges
                    .make(&config.policy.clone().unwrap_or_default(), &config)
                    .map_err(Error::Config)
                    .and_then(|j| Stack::new(link, &config, j, fallback_dns));
                match made {
                    Ok(stack) => {
                        control.reply(&NetdReply::default())?;
                        break (stack, config);
                    }
                    Err(e) => control.reply(&error_reply(e))?,
                }
            }
            Some(_) => control.reply(&error_reply("not started"))?,
            None => control.reply(&error_reply("empty control message"))?,
        }
    };
    stack.watch(control.raw_fd())?;
    loop {
        let turn = stack.turn()?;
        if turn.link_closed {
            return Ok(());
        }
        if !turn.control {
            continue;
        }
        loop {
            let msg = match control.recv(true)? {
                Received::Closed => return Ok(()),
                Received::Nothing => break,
                Received::Message(m, _) => m,
            };
            let reply = handle(&mut stack, &mut config, judges, msg);
            control.reply(&reply)?;
        }
    }
}

fn handle(stack: &mut Stack, config: &mut NetConfig, judges: &dyn JudgeFactory, msg: NetdControl) -> NetdReply {
    match msg.msg {
        Some(netd_control::Msg::Policy(p)) => match judges.make(&p, config) {
            Ok(j) => {
                stack.set_judge(j);
                config.policy = Some(p);
                NetdReply::default()
            }
            Err(e) => error_reply(e),
        },
        Some(netd_control::Msg::Stats(_)) => NetdReply { error: String::new(), stats: Some(stack.stats()) },
        Some(netd_control::Msg::Start(_)) => error_reply("already started"),
        None => error_reply("empty control message"),
    }
}
