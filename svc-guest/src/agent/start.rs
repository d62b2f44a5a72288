//! A held command's start ([`crate::proto::Exec::held`]): prepared on its `Open`, started only
//! on the host's `Go`; discarded on its `Cancel`, or when the host goes away (its end of the
//! channel closes, or another host says hello) before either. The first word is the one that
//! counts: a `Go` after a `Cancel` starts nothing.

use tokio::sync::oneshot;

use crate::proto::{Frame, Kind};

/// What became of a held command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The host said `Go`: start it.
    Go,
    /// The host said `Cancel`: its caller was told it did not run.
    Cancelled,
    /// The host went away before saying either.
    HostGone,
}

/// The host's side of a held command, kept with its stream: where its `Go` or `Cancel` goes.
pub(super) struct Gate(Option<oneshot::Sender<Verdict>>);

/// The command's side: waits for the verdict.
pub(super) struct Held(oneshot::Receiver<Verdict>);

/// A gate and the command held behind it.
pub(super) fn held() -> (Gate, Held) {
    let (tx, rx) = oneshot::channel();
    (Gate(Some(tx)), Held(rx))
}

impl Gate {
    /// Say `verdict`, unless one was said already.
    pub(super) fn say(&mut self, verdict: Verdict) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(verdict);
        }
    }
}

impl Held {
    /// The verdict; [`Verdict::HostGone`] once the gate is dropped unsaid (the host's streams
    /// were ended).
    pub(super) async fn verdict(self) -> Verdict {
        self.0.await.unwrap_or(Verdict::HostGone)
    }
}

impl Verdict {
    /// The answer on stream `id` for a command not started, or `None` for `Go`.
    pub(super) fn refusal(self, id: u32) -> Option<Frame> {
        let why = match self {
            Self::Go => return None,
            Self::Cancelled => {
                "the host cancelled this command before it started (its caller \
                                was told it did not run): discarded, never started"
            }
            Self::HostGone => {
                "the host went away before it said to start this command: \
                               discarded, never started"
            }
        };
        Some(Frame::new(id, Kind::Error, why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(h: Held) -> Verdict {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(h.verdict())
    }

    #[test]
    fn the_first_word_counts_and_silence_is_the_host_gone() {
        struct Case {
            name: &'static str,
            said: &'static [Verdict],
            want: Verdict,
        }
        for c in [
            Case {
                name: "go",
                said: &[Verdict::Go],
                want: Verdict::Go,
            },
            Case {
                name: "cancel",
                said: &[Verdict::Cancelled],
                want: Verdict::Cancelled,
            },
            Case {
                name: "a go after a cancel starts nothing",
                said: &[Verdict::Cancelled, Verdict::Go],
                want: Verdict::Cancelled,
            },
            Case {
                name: "a cancel after a go stops nothing",
                said: &[Verdict::Go, Verdict::Cancelled],
                want: Verdict::Go,
            },
            Case {
                name: "the gate dropped unsaid",
                said: &[],
                want: Verdict::HostGone,
            },
        ] {
            let (mut gate, held) = held();
            for v in c.said {
                gate.say(*v);
            }
            drop(gate);
            assert_eq!(verdict(held), c.want, "{}", c.name);
        }
    }

    #[test]
    fn only_go_starts_and_the_others_say_why_not() {
        assert_eq!(Verdict::Go.refusal(3), None);
        for (v, want) in [
            (Verdict::Cancelled, "cancelled"),
            (Verdict::HostGone, "went away"),
        ] {
            let f = v.refusal(3).expect("a refusal");
            assert_eq!((f.stream, f.kind), (3, Kind::Error));
            let said = String::from_utf8_lossy(&f.payload);
            assert!(
                said.contains(want) && said.contains("never started"),
                "{said}"
            );
        }
    }

    /// The real agent (`serve`) over a socket pair, driven frame by frame, its commands real
    /// processes on this host.
    mod served {
        use std::{sync::Arc, time::Duration};

        use tokio::{
            io::AsyncWriteExt as _,
            net::{UnixStream, unix::OwnedReadHalf, unix::OwnedWriteHalf},
        };

        use crate::proto::{self, Exec, FEATURES, Frame, HELD_EXEC, Kind, Request};

        struct NoSystem;

        impl crate::agent::System for NoSystem {
            fn setup(&self, _: &crate::proto::Setup) -> Result<(), String> {
                Err("no".into())
            }
            fn mount(&self, _: &str, _: &str) -> Result<(), String> {
                Err("no".into())
            }
        }

        fn agent() -> (OwnedReadHalf, OwnedWriteHalf) {
            let (host, agent) = UnixStream::pair().expect("pair");
            let (ar, aw) = agent.into_split();
            tokio::spawn(crate::agent::serve(
                ar,
                aw,
                Arc::new(NoSystem),
                Arc::default(),
            ));
            host.into_split()
        }

        async fn send(w: &mut OwnedWriteHalf, f: Frame) {
            w.write_all(&f.encode()).await.expect("write");
        }

        /// A held `touch MARKER`.
        fn touch(marker: &std::path::Path) -> Frame {
            let exec = Exec {
                argv: vec!["touch".into(), marker.display().to_string()],
                env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                held: true,
                ..Exec::default()
            };
            let json = serde_json::to_vec(&Request::Exec(exec)).expect("json");
            Frame::new(0, Kind::Open, json)
        }

        fn on(stream: u32, mut f: Frame) -> Frame {
            f.stream = stream;
            f
        }

        /// The agent's next frame on `stream` (others skipped), within 10 s.
        async fn next_on(r: &mut OwnedReadHalf, stream: u32) -> Frame {
            tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    let f = proto::read_frame(r).await.expect("frame").expect("open");
                    if f.stream == stream && f.kind != Kind::Credit {
                        return f;
                    }
                }
            })
            .await
            .expect("an answer within 10 s")
        }

        #[tokio::test]
        async fn the_agent_says_it_holds_before_it_says_ready() {
            let (mut r, mut w) = agent();
            send(&mut w, Frame::new(0, Kind::Hello, "n1")).await;
            let first = next_on(&mut r, 0).await;
            assert_eq!(
                String::from_utf8_lossy(&first.payload),
                format!("{FEATURES} n1 {HELD_EXEC}")
            );
            let second = next_on(&mut r, 0).await;
            assert_eq!(
                String::from_utf8_lossy(&second.payload),
                format!("{} n1", crate::READY)
            );
        }

        #[tokio::test]
        async fn a_held_command_starts_on_go_and_only_then() {
            let dir = tempfile::tempdir().expect("tempdir");
            let marker = dir.path().join("ran");
            let (mut r, mut w) = agent();
            send(&mut w, Frame::new(0, Kind::Hello, "n1")).await;
            send(&mut w, on(1, touch(&marker))).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(!marker.exists(), "started before its go");
            send(&mut w, Frame::new(1, Kind::Go, Vec::new())).await;
            let end = next_on(&mut r, 1).await;
            assert_eq!((end.kind, end.as_i32()), (Kind::Exit, Some(0)), "{end:?}");
            assert!(marker.exists());
        }

        #[tokio::test]
        async fn a_held_command_cancelled_or_left_never_starts() {
            let dir = tempfile::tempdir().expect("tempdir");
            let (mut r, mut w) = agent();
            send(&mut w, Frame::new(0, Kind::Hello, "n1")).await;

            // Cancelled: a go after it starts nothing, and the agent says so.
            let cancelled = dir.path().join("cancelled");
            send(&mut w, on(1, touch(&cancelled))).await;
            send(&mut w, Frame::new(1, Kind::Cancel, Vec::new())).await;
            send(&mut w, Frame::new(1, Kind::Go, Vec::new())).await;
            let end = next_on(&mut r, 1).await;
            let said = String::from_utf8_lossy(&end.payload);
            assert!(
                end.kind == Kind::Error && said.contains("cancelled"),
                "{end:?}"
            );

            // Left by a host that another replaced (a new hello), then by one that went away
            // (its end closed): neither starts, even told to go by the next host.
            let replaced = dir.path().join("replaced");
            send(&mut w, on(2, touch(&replaced))).await;
            send(&mut w, Frame::new(0, Kind::Hello, "n2")).await;
            send(&mut w, Frame::new(2, Kind::Go, Vec::new())).await;
            let gone = dir.path().join("gone");
            send(&mut w, on(3, touch(&gone))).await;
            drop(w);
            tokio::time::sleep(Duration::from_secs(1)).await;
            for m in [&cancelled, &replaced, &gone] {
                assert!(!m.exists(), "{} ran", m.display());
            }
            drop(r);
        }
    }
}
