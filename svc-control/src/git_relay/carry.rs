//! One allowed session carried: ssh run against the checked address, git's input carried to
//! it — a push's command list held until every ref git would update is checked — and the
//! server's output carried back, until ssh or the shim ends.

use std::sync::atomic::Ordering;

use svc_guest::proto::{self, Frame, Kind, WINDOW};
use tokio::{io::AsyncRead, process::Child, sync::mpsc};

use super::{
    client::{SshClient, dial_address, ssh_command},
    held,
    session::{RelayPolicy, Session},
    streams::{Input, Output},
};
use crate::policy::ssh::{self, Service, SshRequest, ref_refusal};

/// What a session is carried between, borrowed for its length.
pub(super) struct Carried<'a, R> {
    /// The shim's frames (git's input and credit).
    pub reader: &'a mut R,
    /// Frames to the shim.
    pub out: &'a mpsc::UnboundedSender<Frame>,
    /// The shim's stream.
    pub id: u32,
    pub request: &'a SshRequest,
    pub policy: &'a RelayPolicy,
}

impl<R: AsyncRead + Unpin> Carried<'_, R> {
    /// Run ssh and pump the session; a refused push is `Err` with its line.
    pub async fn relay(
        self,
        git_protocol: Option<String>,
        client: &SshClient,
        session: Session,
    ) -> Result<Session, (Session, String)> {
        let port = self.request.port.unwrap_or(22);
        let dial = match dial_address(client, &self.request.host, port).await {
            Ok(a) => a,
            Err(line) => return Err((session, line)),
        };
        let mut cmd = ssh_command(client, self.request, dial, git_protocol);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let line = format!("svc: the relay cannot run {}: {e}", client.binary.display());
                return Err((session, line));
            }
        };
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err((session, "svc: the relay lost ssh's pipes".into()));
        };
        let output = Output::start(self.id, stdout, stderr, self.out);
        let input = Input::start(self.id, stdin, self.out);
        // git's input to the server: a push's command list is held until every ref is checked.
        let held = (self.request.service == Service::ReceivePack).then(Vec::new);
        Pumping {
            at: self,
            child,
            output,
            input,
            held,
            schedule: held::Schedule::default(),
            up: 0,
            session,
        }
        .run()
        .await
    }
}

/// A session while ssh runs.
struct Pumping<'a, R> {
    at: Carried<'a, R>,
    child: Child,
    output: Output,
    input: Input,
    /// A push's command list while it is held (`None` once let through, or for a fetch).
    held: Option<Vec<u8>>,
    schedule: held::Schedule,
    /// Bytes of git's input.
    up: u64,
    session: Session,
}

impl<R: AsyncRead + Unpin> Pumping<'_, R> {
    async fn run(mut self) -> Result<Session, (Session, String)> {
        let exited = loop {
            // git's next frame, or ssh's end (then git's input has nowhere to go: a client that
            // waits for the server would wait forever).
            let frame = tokio::select! {
                f = proto::read_frame(self.at.reader) => match f {
                    Ok(Some(f)) => f,
                    // The shim went away (it ends its input with Eof, never by closing): nobody
                    // reads the server's output any more.
                    Ok(None) | Err(_) => {
                        let _ = self.child.kill().await;
                        break None;
                    }
                },
                status = self.child.wait() => break Some(status),
            };
            match frame.kind {
                Kind::Data => {
                    if let Err(line) = self.data(frame.payload) {
                        return Err(self.cut(line).await);
                    }
                }
                Kind::Eof => {
                    if self.held.is_some() {
                        // git ended before its command list was whole: nothing reaches the
                        // server.
                        let _ = self.child.kill().await;
                        break None;
                    }
                    self.input.feed = None;
                }
                Kind::Credit => self.output.add_credit(&frame),
                _ => {}
            }
        };
        Ok(self.end(exited).await)
    }

    /// git's bytes: to ssh, or into the held command list. `Err`: the line the session is cut
    /// with (past the window, a refused ref, a command list svc cannot read as git does).
    fn data(&mut self, payload: Vec<u8>) -> Result<(), String> {
        let n = payload.len();
        self.up += n as u64;
        let holding = self.input.unread.fetch_add(n, Ordering::SeqCst) + n;
        if holding > WINDOW as usize {
            return Err(window_refusal(holding));
        }
        let ready = match self.held {
            None => Some((payload, true)),
            Some(_) => self.hold(payload)?,
        };
        if let (Some(chunk), Some(f)) = (ready, self.input.feed.as_ref()) {
            let _ = f.send(chunk);
        }
        Ok(())
    }

    /// A push's bytes, credited at once and held; the whole command list (not to be credited
    /// again) once it is read and every ref it updates is allowed.
    fn hold(&mut self, payload: Vec<u8>) -> Result<Option<(Vec<u8>, bool)>, String> {
        let Some(buf) = self.held.as_mut() else {
            return Ok(Some((payload, true)));
        };
        let n = payload.len();
        self.input.unread.fetch_sub(n, Ordering::SeqCst);
        let _ = self
            .at
            .out
            .send(Frame::u32(self.at.id, Kind::Credit, n as u32));
        buf.extend_from_slice(&payload);
        let read = if self.schedule.due(buf) {
            ssh::parse_push(buf)
        } else {
            Ok(None)
        };
        match read {
            Ok(None) => Ok(None),
            Ok(Some(push)) => {
                // Every ref git would update, refused or not, in the audit.
                self.session.refs = push.updates.clone();
                self.session.signed = push.signed;
                if let Some(bad) = ssh::first_refused(&self.at.policy.branches, &push.updates) {
                    return Err(ref_refusal(&bad.name));
                }
                Ok(self.held.take().map(|b| (b, false)))
            }
            Err(e) => {
                // Nothing reaches the server; the audit names what git would have applied.
                (self.session.refs, self.session.signed) = ssh::git_reading(buf);
                Err(format!("svc: refused: {e}"))
            }
        }
    }

    /// Cut the session: ssh killed, nothing more carried either way.
    async fn cut(mut self, line: String) -> (Session, String) {
        let _ = self.child.kill().await;
        self.input.writer.abort();
        self.output.abort();
        (self.session, line)
    }

    /// ssh has ended (or was killed): the server's last output handed on, then git gets its
    /// exit status.
    async fn end(mut self, exited: Option<std::io::Result<std::process::ExitStatus>>) -> Session {
        self.input.feed = None;
        let status = match exited {
            Some(s) => s,
            None => self.child.wait().await,
        };
        self.input.writer.abort();
        let down = self.output.down.clone();
        self.output.drain(self.at.reader).await;
        let code = status.ok().and_then(|s| s.code()).unwrap_or(255);
        let _ = self.at.out.send(Frame::i32(self.at.id, Kind::Exit, code));
        let mut session = self.session;
        session.decision = "allow";
        session.exit = code;
        session.bytes_up = self.up;
        session.bytes_down = down.load(Ordering::Relaxed);
        session
    }
}

/// The line git's stderr gets when its shim sends past its credit window (a client that is not
/// the image's shim: the shim waits for credit).
pub fn window_refusal(holding: usize) -> String {
    format!(
        "svc: refused: the git SSH client sent {holding} bytes the relay had not credited (its \
         window is {WINDOW} bytes); the session is cut"
    )
}
