//! Where `--repo`'s CODE_HOST_TOKEN comes from when the request gives none, with the real svcd,
//! proxy and Debian's `gh`: no token file and no CLI login is a clear refusal at creation
//! (never a 401 later); with root's `gh` logged in to the code host, its token is brokered and
//! reaches the code host in place of the guest's placeholder.

use svc_tests::{
    require_root,
    world::{CODE_TOKEN, World},
};

#[test]
fn repo_sandboxes_take_the_hosts_code_host_login_or_are_refused_by_name() {
    require_root();
    let w = World::start_without_code_token();
    let out = w.svc(&["sandbox", "create", "--repo", "acme/widget", "nologin"]);
    assert!(!out.status.success(), "created without any token");
    let err = String::from_utf8_lossy(&out.stderr);
    for says in [
        "--repo acme/widget needs the code host's token",
        "--secret CODE_HOST_TOKEN@store:NAME",
        "credentials.code_host_token_file",
        "gh auth login --hostname code.test",
    ] {
        assert!(err.contains(says), "{says:?} not in: {err}");
    }

    // Root's gh logged in to the code host (gh's own hosts.yml).
    let gh = w.dir.join("gh");
    std::fs::create_dir_all(&gh).expect("gh dir");
    std::fs::write(
        gh.join("hosts.yml"),
        format!(
            "code.test:\n    oauth_token: {CODE_TOKEN}\n    user: svc\n    git_protocol: https\n"
        ),
    )
    .expect("hosts.yml");
    let v: serde_json::Value = serde_json::from_str(&w.svc_ok(&[
        "sandbox",
        "create",
        "--repo",
        "acme/widget",
        "login",
        "--json",
    ]))
    .expect("json");
    assert!(
        v["secrets"].to_string().contains("auth token"),
        "the source names the CLI: {v}"
    );
    let (code, out, err) = w.sh(
        "login",
        "cd /tmp && git -c http.extraHeader=\"Authorization: Bearer $CODE_HOST_TOKEN\" clone -q https://code.test/acme/widget.git && cat widget/README",
    );
    assert_eq!(code, 0, "{out}{err}");
    let upstream: Vec<serde_json::Value> = w
        .received()
        .into_iter()
        .filter(|r| r["kind"] == "http" && r["host"] == "code.test")
        .collect();
    assert!(!upstream.is_empty());
    assert!(
        upstream
            .iter()
            .all(|r| r["authorization"] == format!("Bearer {CODE_TOKEN}")),
        "{upstream:?}"
    );
    let (_, env, _) = w.sh("login", "env");
    assert!(!env.contains(CODE_TOKEN), "the real token is in the guest");
    w.destroy_checked("login");
}
