//! Whether the agent has read what this host sent: a request no agent knows, answered at once;
//! and a command's start bounded by it ([`Channel::start`]).
//!
//! The agent reads its frames in order and answers a request it cannot parse at once, with an
//! `Error` on that request's own stream and nothing else done (`svc_guest::agent`). So the
//! answer to such a request, sent after an `Open`, says the agent has read that `Open`: the
//! command is started (or refused on its own stream). An agent that is stopped (a guest that
//! sends its init's server `SIGSTOP`) or otherwise stuck never answers, and the caller's wait
//! for it is bounded instead of its command's.
//!
//! A command the caller was told failed must never run later, when the agent reads its queue
//! again (its process continued, its VM resumed). So an agent that holds commands (it said so
//! in its hello) is asked to ([`Exec::held`]): it prepares the command on its `Open` and
//! starts it on this host's `Go`, which [`Channel::start`] sends only if the probe's answer
//! came within the limit. Late, it sends `Cancel` instead and never a `Go`, and the caller
//! gives the channel up; the agent then discards the command, whichever of the `Cancel`, the
//! channel's end or the next host's hello it reads first (the ordering argument is in
//! [`svc_guest::proto`]). An agent from before held starts gets the one-phase start: the
//! caller's wait is bounded all the same, but a command it reads late still runs.

use std::{sync::Arc, time::Duration};

use svc_guest::proto::{Exec, Frame, Kind};
use tokio::sync::{Semaphore, mpsc};

use super::{
    Channel, ExecHandle,
    streams::{Event, StreamOut, lock},
};

/// How long a guest's agent (or a container's init) has to take a command, that is to read its
/// request (the command then runs as long as it runs): long enough that a loaded host is not
/// taken for a stopped or stuck guest.
pub const START: Duration = Duration::from_secs(10);

/// The request: an operation no agent has, so every agent refuses it at once.
const PROBE: &[u8] = br#"{"op":"ping"}"#;

/// Why the agent did not say it read what was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoAck {
    /// The channel ended (the reason).
    Ended(String),
    /// No answer within the limit: the agent is stopped or stuck.
    Late,
}

impl Channel {
    /// Run `exec` in the guest once the agent took it within `limit`: held until then when
    /// the agent holds commands, and cancelled when it did not take it in time (the caller is
    /// then to give the channel up). Its handle, or why not.
    pub async fn start(
        self: &Arc<Self>,
        mut exec: Exec,
        limit: Duration,
    ) -> Result<ExecHandle, NoAck> {
        exec.held = self.holds_exec();
        let (id, handle) = self.exec_stream(exec).map_err(NoAck::Ended)?;
        match self.acked(limit).await {
            Ok(()) if self.holds_exec() => {
                self.out
                    .send(Frame::new(id, Kind::Go, Vec::new()))
                    .map_err(|_| NoAck::Ended(self.ended_reason()))?;
                Ok(handle)
            }
            Ok(()) => Ok(handle),
            Err(no) => {
                // Never a `Go` on this stream from now on: the agent discards the command.
                let _ = self.out.send(Frame::new(id, Kind::Cancel, Vec::new()));
                Err(no)
            }
        }
    }

    /// Wait, at most `limit`, until the agent has read every frame sent before this call.
    pub async fn acked(&self, limit: Duration) -> Result<(), NoAck> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, mut events) = mpsc::unbounded_channel();
        lock(&self.streams).insert(
            id,
            StreamOut {
                events: tx,
                credit: Arc::new(Semaphore::new(0)),
                unread: Arc::default(),
            },
        );
        if self
            .out
            .send(Frame::new(id, Kind::Open, PROBE.to_vec()))
            .is_err()
        {
            lock(&self.streams).remove(&id);
            return Err(NoAck::Ended(self.ended_reason()));
        }
        // The channel may have ended before the stream was there to hear it.
        let mut ended = self.ended.clone();
        let answer = tokio::time::timeout(limit, async {
            loop {
                tokio::select! {
                    biased;
                    event = events.recv() => match event {
                        Some(Event::Exit(_) | Event::Error(_)) => return Ok(()),
                        // Output on it is the agent's to send on no request of ours: ignored
                        // (and bounded by the stream's window, as any stream's).
                        Some(Event::Stdout(_) | Event::Stderr(_)) => {}
                        None => return Err(NoAck::Ended(self.ended_reason())),
                    },
                    _ = ended.wait_for(Option::is_some) => {
                        return Err(NoAck::Ended(self.ended_reason()));
                    }
                }
            }
        })
        .await;
        answer.unwrap_or_else(|_| {
            lock(&self.streams).remove(&id);
            Err(NoAck::Late)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real agent over a socket pair: it answers the probe, after the frames before it.
    #[tokio::test]
    async fn the_agent_answers_at_once_and_a_silent_one_is_late() {
        let (channel, served) = greeted_agent().await;
        assert_eq!(channel.acked(Duration::from_secs(5)).await, Ok(()));
        served.abort();
        let _ = served.await;

        // A peer that reads nothing and says nothing.
        let (host, silent) = tokio::net::UnixStream::pair().expect("pair");
        let (r, w) = host.into_split();
        let (channel, _hellos) = Channel::over(r, w);
        assert_eq!(
            channel.acked(Duration::from_millis(200)).await,
            Err(NoAck::Late)
        );
        drop(silent);
    }

    /// A held command starts (this host said `Go`) once the real agent answered in time; one
    /// whose agent was silent past the limit is cancelled and never told to go, as the agent
    /// finds once it reads its queue.
    #[tokio::test]
    async fn a_late_start_is_cancelled_and_never_told_to_go() {
        let (channel, served) = greeted_agent().await;
        assert!(channel.holds_exec(), "the agent said it holds commands");
        let exec = |argv: &[&str]| Exec {
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            ..Exec::default()
        };
        let mut started = channel
            .start(exec(&["true"]), Duration::from_secs(5))
            .await
            .expect("started");
        assert_eq!(started.control.wait().await.expect("its end"), 0);
        served.abort();
        let _ = served.await;

        // An agent that says it holds commands, then reads nothing until the host gave up.
        let (host, silent) = tokio::net::UnixStream::pair().expect("pair");
        let (r, w) = host.into_split();
        let (channel, _hellos) = Channel::over(r, w);
        channel
            .held_exec
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let late = channel
            .start(
                exec(&["touch", "/nonexistent/never"]),
                Duration::from_millis(200),
            )
            .await;
        assert!(matches!(late, Err(NoAck::Late)), "{:?}", late.err());
        channel.abandon("given up".into());
        drop(channel);
        let mut queued = silent;
        let mut frames = Vec::new();
        while let Some(f) = svc_guest::proto::read_frame(&mut queued)
            .await
            .expect("frames")
        {
            frames.push((f.stream, f.kind));
        }
        let open = frames
            .iter()
            .find(|(_, k)| *k == Kind::Open)
            .map(|(s, _)| *s)
            .expect("the command's open");
        assert!(frames.contains(&(open, Kind::Cancel)), "{frames:?}");
        assert!(!frames.iter().any(|(_, k)| *k == Kind::Go), "{frames:?}");
    }

    /// A channel to the real agent served over a socket pair, greeted; the agent's task.
    async fn greeted_agent() -> (
        Arc<Channel>,
        tokio::task::JoinHandle<Result<(), svc_guest::proto::ProtoError>>,
    ) {
        let (host, agent) = tokio::net::UnixStream::pair().expect("pair");
        let (ar, aw) = agent.into_split();
        let served = tokio::spawn(svc_guest::agent::serve(
            ar,
            aw,
            Arc::new(NoSystem),
            Arc::default(),
        ));
        let (r, w) = host.into_split();
        let (channel, mut hellos) = Channel::over(r, w);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        channel.greet(&mut hellos, deadline).await.expect("greeted");
        (channel, served)
    }

    struct NoSystem;

    impl svc_guest::agent::System for NoSystem {
        fn setup(&self, _: &svc_guest::proto::Setup) -> Result<(), String> {
            Err("no".into())
        }
        fn mount(&self, _: &str, _: &str) -> Result<(), String> {
            Err("no".into())
        }
    }
}
