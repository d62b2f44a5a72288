//! The host↔guest channel of the microvm backend, end to end without a VM: svcd's side
//! (`runtime::microvm::channel`) and the agent's (`svc_guest::agent`) over a socket pair, the
//! agent running real processes on this host. Plus a hostile "agent" that breaks the protocol.
#![expect(clippy::expect_used, reason = "test helpers")]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use svc_control::runtime::{ExecHandle, GuestConn, GuestService, microvm::channel::Channel};
use svc_guest::proto::{self, Exec, Frame, GUEST_STREAM, Kind, Request, Setup, WINDOW};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::UnixStream,
};

/// Records the setups it is asked for (the guest's real one changes the guest's network).
#[derive(Default)]
struct Recorded(Mutex<Vec<Setup>>);

impl svc_guest::agent::System for Recorded {
    fn mount(&self, tag: &str, path: &str) -> Result<(), String> {
        Err(format!("no virtio-fs here ({tag} at {path})"))
    }

    fn setup(&self, setup: &Setup) -> Result<(), String> {
        if setup.hostname.is_empty() {
            return Err("no host name".into());
        }
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(setup.clone());
        Ok(())
    }
}

/// A channel to a real agent over a socket pair.
async fn pair() -> (Arc<Channel>, Arc<Recorded>) {
    let (host, guest) = UnixStream::pair().expect("socket pair");
    let system = Arc::new(Recorded::default());
    let (gr, gw) = guest.into_split();
    tokio::spawn(svc_guest::agent::serve(
        gr,
        gw,
        system.clone(),
        Arc::default(),
    ));
    let (hr, hw) = host.into_split();
    let (channel, mut hello) = Channel::over(hr, hw);
    channel
        .greet(
            &mut hello,
            std::time::Instant::now() + Duration::from_secs(5),
        )
        .await
        .expect("the agent answers hello");
    (channel, system)
}

fn exec(argv: &[&str]) -> Exec {
    Exec {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        ..Exec::default()
    }
}

/// Everything a command says and its exit code.
async fn output(mut h: ExecHandle) -> (Vec<u8>, Vec<u8>, i32) {
    let mut out = h.stdout.take().expect("stdout");
    let err = h.stderr.take();
    let o = tokio::spawn(async move {
        let mut v = Vec::new();
        out.read_to_end(&mut v).await.expect("read stdout");
        v
    });
    let e = tokio::spawn(async move {
        let mut v = Vec::new();
        if let Some(mut err) = err {
            err.read_to_end(&mut v).await.expect("read stderr");
        }
        v
    });
    let code = tokio::time::timeout(Duration::from_secs(30), h.wait())
        .await
        .expect("the command ends")
        .expect("an exit code");
    (o.await.expect("join"), e.await.expect("join"), code)
}

#[tokio::test]
async fn commands_run_with_their_streams_and_exit_codes() {
    let (ch, _) = pair().await;
    let (out, err, code) = output(
        ch.exec(exec(&["sh", "-c", "echo out; echo err >&2; exit 3"]))
            .expect("exec"),
    )
    .await;
    assert_eq!(
        (out.as_slice(), err.as_slice(), code),
        (&b"out\n"[..], &b"err\n"[..], 3)
    );

    let (out, err, code) = output(ch.exec(exec(&["no-such-command-here"])).expect("exec")).await;
    assert_eq!(code, 127, "not found is 127 as in a shell");
    assert!(out.is_empty());
    assert!(
        String::from_utf8_lossy(&err).contains("no-such-command-here"),
        "{}",
        String::from_utf8_lossy(&err)
    );

    // The environment is exactly the one given.
    let mut e = exec(&["sh", "-c", "echo $SVC_X:${HOME:-unset}"]);
    e.env.push(("SVC_X".into(), "1".into()));
    e.cwd = Some("/tmp".into());
    let (out, _, _) = output(ch.exec(e).expect("exec")).await;
    assert_eq!(out, b"1:unset\n");
}

#[tokio::test]
async fn large_input_and_output_flow_within_the_window() {
    let (ch, _) = pair().await;
    // 3 MiB out: twelve windows, so credit must come back for it to finish.
    let (out, _, code) = output(
        ch.exec(exec(&["head", "-c", "3145728", "/dev/zero"]))
            .expect("exec"),
    )
    .await;
    assert_eq!((out.len(), code), (3 << 20, 0));

    // 2 MiB in.
    let mut e = exec(&["wc", "-c"]);
    e.stdin = true;
    let mut h = ch.exec(e).expect("exec");
    let mut stdin = h.stdin.take().expect("stdin");
    tokio::spawn(async move {
        stdin.write_all(&vec![b'x'; 2 << 20]).await.expect("write");
        stdin.shutdown().await.expect("eof");
    });
    let (out, _, code) = output(h).await;
    assert_eq!((String::from_utf8_lossy(&out).trim(), code), ("2097152", 0));
}

#[tokio::test]
async fn a_reader_that_stops_stalls_only_its_own_stream() {
    let (ch, _) = pair().await;
    // Nobody reads this one's 4 MiB: it fills its window and waits.
    let mut stuck = ch
        .exec(exec(&["head", "-c", "4194304", "/dev/zero"]))
        .expect("exec");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (out, _, code) = output(ch.exec(exec(&["echo", "still here"])).expect("exec")).await;
    assert_eq!((out.as_slice(), code), (&b"still here\n"[..], 0));
    // Reading it now lets it finish.
    let mut rest = Vec::new();
    stuck
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut rest)
        .await
        .expect("read");
    assert_eq!(rest.len(), 4 << 20);
    assert_eq!(stuck.wait().await.expect("code"), 0);
}

#[tokio::test]
async fn terminals_resize_and_signals_reach_the_command() {
    let (ch, _) = pair().await;
    let mut e = exec(&["sh", "-c", "stty size; tty >/dev/null && echo on-a-tty"]);
    e.tty = Some((24, 80));
    let (out, _, code) = output(ch.exec(e).expect("exec")).await;
    let out = String::from_utf8_lossy(&out);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("24 80") && out.contains("on-a-tty"), "{out:?}");

    let mut e = exec(&[
        "sh",
        "-c",
        "trap 'stty size; exit 0' WINCH; while :; do sleep 0.05; done",
    ]);
    e.tty = Some((24, 80));
    let h = ch.exec(e).expect("exec");
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.resize(30, 100).expect("resize");
    let (out, _, code) = output(h).await;
    assert!(
        String::from_utf8_lossy(&out).contains("30 100"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(code, 0);

    let h = ch.exec(exec(&["sleep", "30"])).expect("exec");
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.signal(nix::sys::signal::Signal::SIGTERM);
    let (_, _, code) = output(h).await;
    assert_eq!(code, 128 + 15, "ended by SIGTERM");
}

#[tokio::test]
async fn files_are_written_whole_and_bad_paths_refused() {
    let (ch, system) = pair().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("etc/resolv.conf");
    let body = vec![b'n'; 200_000];
    ch.call(
        &Request::WriteFile {
            path: path.display().to_string(),
            mode: 0o644,
        },
        &body,
    )
    .await
    .expect("written");
    assert_eq!(std::fs::read(&path).expect("read"), body);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&path).expect("meta").permissions(),
    );
    assert_eq!(mode & 0o777, 0o644);
    for bad in ["relative/file", "/tmp/../etc/passwd"] {
        let err = ch
            .call(
                &Request::WriteFile {
                    path: bad.into(),
                    mode: 0o644,
                },
                b"x",
            )
            .await
            .expect_err(bad);
        assert!(
            err.contains("not an absolute path without `..`"),
            "{bad}: {err}"
        );
    }
    let setup = Setup {
        hostname: "sb1".into(),
        address: "10.0.0.2/30".into(),
        gateway: "10.0.0.1".into(),
        entropy: "00ff".into(),
        clock_ms: 1,
    };
    ch.call(&Request::Setup(setup.clone()), b"")
        .await
        .expect("setup");
    assert_eq!(*system.0.lock().expect("lock"), vec![setup]);
    let err = ch
        .call(
            &Request::Setup(Setup {
                hostname: String::new(),
                address: "10.0.0.2/30".into(),
                gateway: "10.0.0.1".into(),
                entropy: String::new(),
                clock_ms: 1,
            }),
            b"",
        )
        .await
        .expect_err("refused");
    assert_eq!(err, "setup: no host name");
}

/// A hostile guest: writes what it likes on the channel.
async fn hostile(frames: Vec<Vec<u8>>) -> String {
    hostile_with(frames, None).await
}

/// [`hostile`] with a service for the streams the guest opens.
async fn hostile_with(frames: Vec<Vec<u8>>, service: Option<GuestService>) -> String {
    let (host, guest) = UnixStream::pair().expect("pair");
    let (hr, hw) = host.into_split();
    let (ch, _) = Channel::over(hr, hw);
    if let Some(s) = service {
        ch.serve_guest(s);
    }
    let h = ch.exec(exec(&["anything"])).expect("exec");
    let (mut gr, mut gw) = guest.into_split();
    // It reads what the host says (so nothing is reset), and says its piece, then ends.
    let drain = tokio::spawn(async move { tokio::io::copy(&mut gr, &mut tokio::io::sink()).await });
    for f in frames {
        gw.write_all(&f).await.expect("write");
    }
    gw.shutdown().await.expect("end of the guest's output");
    let mut h = h;
    let err = tokio::time::timeout(Duration::from_secs(5), h.wait())
        .await
        .expect("ends")
        .expect_err("the command fails");
    assert!(!ch.is_open(), "the channel ended");
    drain.abort();
    err.to_string()
}

#[tokio::test]
async fn a_guest_that_breaks_the_protocol_ends_the_channel() {
    // Stream 1 is the exec above; the guest floods it past its window (plus the one frame
    // the host handed on, and credited, before its unread output stalled it).
    let flood: Vec<Vec<u8>> = (0..(WINDOW as usize / 65536 + 3))
        .map(|_| Frame::new(1, Kind::Stdout, vec![b'x'; 65536]).encode())
        .collect();
    let err = hostile(flood).await;
    assert!(err.contains("on a window of"), "{err}");

    let mut bad = Frame::new(1, Kind::Stdout, b"x".to_vec()).encode();
    bad[4] = 0x7f;
    let err = hostile(vec![bad]).await;
    assert!(err.contains("unknown kind 127"), "{err}");

    let mut huge = Frame::new(1, Kind::Stdout, Vec::new()).encode();
    huge[5..9].copy_from_slice(&u32::MAX.to_be_bytes());
    let err = hostile(vec![huge]).await;
    assert!(err.contains("over the limit"), "{err}");

    // A guest that just goes away.
    let err = hostile(Vec::new()).await;
    assert!(err.contains("closed"), "{err}");
}

/// A service that answers each connection like the relay would: the request, then the
/// input upper-cased on stdout (credited), then exit 0.
fn upper_service() -> GuestService {
    Arc::new(|conn: GuestConn| {
        tokio::spawn(async move {
            let GuestConn {
                mut reader,
                mut writer,
            } = conn;
            let open = proto::read_frame(&mut reader)
                .await
                .expect("frame")
                .expect("open");
            assert_eq!(open.kind, Kind::Open);
            let id = open.stream;
            let mut said = Vec::new();
            while let Some(f) = proto::read_frame(&mut reader).await.expect("frame") {
                match f.kind {
                    Kind::Data => {
                        let credit = Frame::u32(id, Kind::Credit, f.payload.len() as u32);
                        writer.write_all(&credit.encode()).await.expect("credit");
                        said.extend_from_slice(&f.payload);
                    }
                    Kind::Eof => break,
                    _ => {}
                }
            }
            let reply = Frame::new(id, Kind::Stdout, said.to_ascii_uppercase());
            writer.write_all(&reply.encode()).await.expect("reply");
            writer
                .write_all(&Frame::i32(id, Kind::Exit, 0).encode())
                .await
                .expect("exit");
        });
    })
}

/// Be the shim on one connection to the agent's hub: open, send `input`, read to the end.
async fn shim(hub: Arc<svc_guest::agent::relay::Hub>, input: &[u8]) -> Vec<Frame> {
    let (ours, theirs) = UnixStream::pair().expect("pair");
    let (tr, tw) = theirs.into_split();
    tokio::spawn(hub.connection(tr, tw));
    let (mut r, mut w) = ours.into_split();
    let open = Request::GitSsh {
        args: vec!["host".into(), "git-upload-pack 'a/b.git'".into()],
        git_protocol: None,
    };
    let json = serde_json::to_vec(&open).expect("json");
    w.write_all(&Frame::new(5, Kind::Open, json).encode())
        .await
        .expect("open");
    w.write_all(&Frame::new(5, Kind::Data, input.to_vec()).encode())
        .await
        .expect("data");
    w.write_all(&Frame::new(5, Kind::Eof, Vec::new()).encode())
        .await
        .expect("eof");
    let mut got = Vec::new();
    while let Ok(Some(f)) = proto::read_frame(&mut r).await {
        got.push(f);
    }
    got
}

#[tokio::test]
async fn streams_the_guest_opens_reach_the_hosts_service_and_back() {
    let (host, guest) = UnixStream::pair().expect("socket pair");
    let hub = Arc::new(svc_guest::agent::relay::Hub::default());
    let (gr, gw) = guest.into_split();
    tokio::spawn(svc_guest::agent::serve(
        gr,
        gw,
        Arc::new(Recorded::default()),
        hub.clone(),
    ));
    let (hr, hw) = host.into_split();
    let (channel, mut hello) = Channel::over(hr, hw);
    channel
        .greet(
            &mut hello,
            std::time::Instant::now() + Duration::from_secs(5),
        )
        .await
        .expect("hello");

    // Before svcd hands the sandbox's streams to a service, they are refused by name.
    let got = shim(hub.clone(), b"early").await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].kind, Kind::Error);
    assert!(
        String::from_utf8_lossy(&got[0].payload).contains("no host service"),
        "{got:?}"
    );

    channel.serve_guest(upper_service());
    // Two connections at once, each answered on its own stream, under the shim's own id.
    let (a, b) = tokio::join!(shim(hub.clone(), b"hello"), shim(hub.clone(), b"world"));
    for (got, want) in [(a, &b"HELLO"[..]), (b, &b"WORLD"[..])] {
        assert!(got.iter().all(|f| f.stream == 5), "{got:?}");
        let out: Vec<u8> = got
            .iter()
            .filter(|f| f.kind == Kind::Stdout)
            .flat_map(|f| f.payload.clone())
            .collect();
        assert_eq!(out, want);
        assert_eq!(
            got.last().map(|f| (f.kind, f.as_i32())),
            Some((Kind::Exit, Some(0)))
        );
    }
    assert!(channel.is_open());
}

#[tokio::test]
async fn a_guest_that_floods_a_stream_it_opened_ends_the_channel() {
    // A service that takes the connection and never reads it: two frames fit in the
    // connection's buffer, then the window fills.
    let held: Arc<Mutex<Vec<GuestConn>>> = Arc::default();
    let service: GuestService = {
        let held = held.clone();
        Arc::new(move |c| held.lock().expect("lock").push(c))
    };
    let id = GUEST_STREAM | 1;
    let open = serde_json::to_vec(&Request::GitSsh {
        args: Vec::new(),
        git_protocol: None,
    })
    .expect("json");
    let mut frames = vec![Frame::new(id, Kind::Open, open).encode()];
    frames.extend(
        (0..(WINDOW as usize / 65536 + 3))
            .map(|_| Frame::new(id, Kind::Data, vec![b'x'; 65536]).encode()),
    );
    let err = hostile_with(frames, Some(service)).await;
    assert!(err.contains("on a window of"), "{err}");
    assert_eq!(
        held.lock().expect("lock").len(),
        1,
        "the service got the stream"
    );
}

/// A hybrid vsock socket (vhost-device-vsock's) whose first `CONNECT` is never answered, as
/// when the request reaches a guest whose vsock driver is still starting: the host gives up on
/// that attempt, connects again, and reaches the agent on the second.
#[tokio::test]
async fn a_vsock_connect_left_unanswered_is_made_again() {
    let dir = std::env::temp_dir().join(format!("svc-vsock-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let socket = dir.join("vsock.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    let attempts = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn({
        let attempts = attempts.clone();
        async move {
            let mut swallowed = Vec::new();
            loop {
                let (mut s, _) = listener.accept().await.expect("accept");
                let mut line = Vec::new();
                let mut byte = [0u8; 1];
                while !line.ends_with(b"\n") {
                    if s.read(&mut byte).await.expect("read") == 0 {
                        break;
                    }
                    line.push(byte[0]);
                }
                let first = {
                    let mut a = attempts
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    a.push(String::from_utf8_lossy(&line).into_owned());
                    a.len() == 1
                };
                if first {
                    // Held open, never answered.
                    swallowed.push(s);
                    continue;
                }
                s.write_all(b"OK 1073741824\n").await.expect("ok");
                let (gr, gw) = s.into_split();
                tokio::spawn(svc_guest::agent::serve(
                    gr,
                    gw,
                    Arc::new(Recorded::default()),
                    Arc::default(),
                ));
            }
        }
    });
    let started = std::time::Instant::now();
    let channel = tokio::time::timeout(
        Duration::from_secs(40),
        Channel::connect_vsock(&socket, 1024, Duration::from_secs(30)),
    )
    .await
    .expect("connect_vsock waited on the unanswered attempt past its own limit")
    .expect("the second attempt reaches the agent");
    let (out, _, code) = output(
        channel
            .exec(exec(&["sh", "-c", "echo over-vsock"]))
            .expect("exec"),
    )
    .await;
    assert_eq!((out.as_slice(), code), (&b"over-vsock\n"[..], 0));
    let seen = attempts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(seen, ["CONNECT 1024\n", "CONNECT 1024\n"], "{seen:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the unanswered attempt held the connect to its limit"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hybrid vsock socket that never answers at all: the connect fails by its limit and says
/// why, instead of waiting for ever.
#[tokio::test]
async fn a_vsock_socket_that_never_answers_fails_by_the_limit() {
    let dir = std::env::temp_dir().join(format!("svc-vsock-mute-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let socket = dir.join("vsock.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        Channel::connect_vsock(&socket, 1024, Duration::from_secs(3)),
    )
    .await
    .expect("connect_vsock returned by its own limit")
    .expect_err("nothing answered");
    assert!(
        err.contains("port 1024") && err.contains("no OK within"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
