//! svcd under a service manager's readiness protocol (systemd's `Type=notify`, as
//! packaging/svcd.service runs it): READY=1 on `$NOTIFY_SOCKET` only once its API answers, and
//! STOPPING=1 when SIGTERM stops it.

use std::{
    os::unix::net::UnixDatagram,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use svc_tests::{require_root, world::World};

/// svcd started by this test; killed if the test ends before it does.
struct Svcd(Child);

impl Drop for Svcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The next datagram on `sock` within `within`, or `None`.
fn next_state(sock: &UnixDatagram, within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    None
}

#[test]
fn svcd_says_ready_only_once_its_api_answers_and_says_stopping_at_sigterm() {
    require_root();
    let mut w = World::start();
    w.kill_svcd();
    let path = w.dir.join("notify.sock");
    let _ = std::fs::remove_file(&path);
    let notify = UnixDatagram::bind(&path).expect("bind the notify socket");
    notify
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let log_path = w.dir.join("svcd-notify.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let mut svcd = Svcd(
        w.svcd_command()
            .env("NOTIFY_SOCKET", &path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("svcd"),
    );
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // The first thing svcd tells the manager is READY=1, and by then svc is answered.
    let ready = next_state(&notify, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no READY=1 within 20 s; svcd's log:\n{}", log()));
    let answered = w.svc(&["sandbox", "list", "--json"]);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        answered.status.success(),
        "READY=1 came before the API answered: {answered:?}\n{}",
        log()
    );
    assert!(
        ready.contains(&format!("MAINPID={}", svcd.0.id())),
        "names its own pid: {ready:?}"
    );
    assert!(
        next_state(&notify, Duration::from_millis(300)).is_none(),
        "one READY=1 only"
    );

    let term = std::process::Command::new("kill")
        .args(["-TERM", &svcd.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let stopping = next_state(&notify, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no STOPPING=1 after SIGTERM; svcd's log:\n{}", log()));
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let status = svcd.0.wait().expect("wait");
    assert!(
        status.success(),
        "svcd stopped cleanly: {status:?}\n{}",
        log()
    );
}
