//! The code-host rules through `policy::request::decide`, each attack next to the
//! legitimate form it imitates.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

mod common;

use common::{Fixture, Want::*, check, req};

const GH: &str = "github.com";
const API: &str = "api.github.com";
const UP: &str = "uploads.github.com";

fn viewer() -> String {
    serde_json::json!({"query": "query { viewer { login } }"}).to_string()
}

#[test]
fn smart_http_only_for_the_bound_repo() {
    let f = Fixture::new();
    let t = f.code_token();
    check(
        &f,
        &[
            (
                "clone_info_refs_bound",
                req("GET", GH, "/acme/widget/info/refs?service=git-upload-pack").bearer(&t),
                Swap,
                "smart-http",
            ),
            (
                "clone_info_refs_bound_dot_git",
                req(
                    "GET",
                    GH,
                    "/acme/widget.git/info/refs?service=git-upload-pack",
                )
                .bearer(&t),
                Swap,
                "smart-http",
            ),
            (
                "push_info_refs_bound",
                req(
                    "GET",
                    GH,
                    "/acme/widget.git/info/refs?service=git-receive-pack",
                )
                .bearer(&t),
                Swap,
                "smart-http",
            ),
            (
                "upload_pack_post_bound",
                req("POST", GH, "/acme/widget.git/git-upload-pack").bearer(&t),
                Swap,
                "smart-http",
            ),
            (
                "receive_pack_post_bound",
                req("POST", GH, "/acme/widget.git/git-receive-pack").bearer(&t),
                Swap,
                "smart-http",
            ),
            (
                "bound_repo_other_case",
                req("GET", GH, "/ACME/Widget/info/refs?service=git-upload-pack").bearer(&t),
                Swap,
                "smart-http",
            ),
            (
                "bound_repo_other_case_dot_git",
                req("POST", GH, "/Acme/WIDGET.git/git-upload-pack"),
                Pass,
                "smart-http",
            ),
            (
                "without_credential_passes_through",
                req("GET", GH, "/acme/widget/info/refs?service=git-upload-pack"),
                Pass,
                "smart-http",
            ),
            (
                "foreign_repo_info_refs",
                req("GET", GH, "/evil/exfil/info/refs?service=git-upload-pack").bearer(&t),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "foreign_repo_receive_pack_refs",
                req(
                    "GET",
                    GH,
                    "/evil/exfil.git/info/refs?service=git-receive-pack",
                ),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "foreign_repo_upload_pack",
                req("POST", GH, "/evil/exfil.git/git-upload-pack"),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "foreign_repo_receive_pack",
                req("POST", GH, "/evil/exfil.git/git-receive-pack").bearer(&t),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "same_owner_other_repo",
                req("POST", GH, "/acme/other.git/git-receive-pack"),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "bound_name_as_prefix",
                req("POST", GH, "/acme/widget-fork.git/git-receive-pack"),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "double_git_suffix",
                req("POST", GH, "/acme/widget.git.git/git-receive-pack"),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "info_refs_unknown_service",
                req(
                    "GET",
                    GH,
                    "/acme/widget/info/refs?service=git-upload-archive",
                ),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "info_refs_no_service",
                req("GET", GH, "/acme/widget/info/refs"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "info_refs_duplicate_service",
                req(
                    "GET",
                    GH,
                    "/evil/x/info/refs?service=git-upload-pack&service=git-upload-pack",
                ),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "info_refs_second_question_mark",
                req(
                    "GET",
                    GH,
                    "/acme/widget/info/refs?service=git-upload-pack?x",
                ),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "info_refs_post",
                req("POST", GH, "/acme/widget/info/refs?service=git-upload-pack"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "upload_pack_get",
                req("GET", GH, "/acme/widget/git-upload-pack"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "smart_http_trailing_slash",
                req("POST", GH, "/acme/widget/git-upload-pack/"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "encoded_slash_in_repo",
                req(
                    "POST",
                    GH,
                    "/acme/widget%2f..%2f..%2fevil%2fexfil/git-upload-pack",
                ),
                Deny(403),
                "target-invalid",
            ),
            (
                "dot_dot_to_foreign_repo",
                req("POST", GH, "/acme/widget/../../evil/exfil/git-upload-pack"),
                Deny(403),
                "target-invalid",
            ),
            (
                "encoded_dot_dot",
                req(
                    "POST",
                    GH,
                    "/acme/widget/%2e%2e/%2e%2e/evil/exfil/git-upload-pack",
                ),
                Deny(403),
                "target-invalid",
            ),
            (
                "mixed_case_encoded_dots",
                req("POST", GH, "/acme/widget/%2E%2e/x/git-upload-pack"),
                Deny(403),
                "target-invalid",
            ),
            (
                "double_slash",
                req("POST", GH, "//evil/exfil/git-upload-pack"),
                Deny(403),
                "target-invalid",
            ),
            (
                "inner_double_slash",
                req("POST", GH, "/acme//widget/git-upload-pack"),
                Deny(403),
                "target-invalid",
            ),
            (
                "backslash",
                req("POST", GH, "/acme\\widget/git-upload-pack"),
                Deny(403),
                "target-invalid",
            ),
            (
                "encoded_backslash",
                req("POST", GH, "/acme%5cwidget/git-upload-pack"),
                Deny(403),
                "target-invalid",
            ),
            (
                "semicolon_params_on_repo",
                req("POST", GH, "/evil/exfil;acme/widget/git-upload-pack"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "semicolon_params_suffix",
                req("POST", GH, "/acme/widget;x=1/git-upload-pack"),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "fragment",
                req("POST", GH, "/acme/widget/git-upload-pack#x"),
                Deny(403),
                "target-invalid",
            ),
            (
                "overlong_utf8_slash",
                req("POST", GH, "/acme/widget%c0%af..%c0%afevil/git-upload-pack"),
                Deny(403),
                "target-invalid",
            ),
            (
                "nul_byte",
                req("POST", GH, "/acme/widget%00/git-upload-pack"),
                Deny(403),
                "target-invalid",
            ),
            (
                "percent_encoded_bound_repo",
                req("POST", GH, "/%61cme/widget/git-upload-pack"),
                Pass,
                "smart-http",
            ),
            (
                "absolute_form_target",
                req("POST", GH, "https://github.com/evil/exfil/git-upload-pack"),
                Deny(403),
                "target-invalid",
            ),
            (
                "repo_with_space",
                req("POST", GH, "/acme/wid%20get/git-upload-pack"),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "owner_starting_with_dash",
                req("POST", GH, "/-oProxyCommand/x/git-upload-pack"),
                Deny(403),
                "smart-http-foreign-repo",
            ),
        ],
    );
}

#[test]
fn archives_and_release_downloads_for_any_repo_with_the_credential_stripped() {
    let f = Fixture::new();
    let t = f.code_token();
    check(
        &f,
        &[
            (
                "archive_bound_repo",
                req("GET", GH, "/acme/widget/archive/refs/heads/main.tar.gz").bearer(&t),
                Strip,
                "archive",
            ),
            (
                "archive_foreign_repo",
                req("GET", GH, "/rust-lang/rust/archive/refs/tags/1.0.0.zip"),
                Strip,
                "archive",
            ),
            (
                "archive_head",
                req("HEAD", GH, "/any/repo/archive/v1.tar.gz").bearer(&t),
                Strip,
                "archive",
            ),
            (
                "release_download",
                req("GET", GH, "/cli/cli/releases/download/v2.0.0/gh.tar.gz").bearer(&t),
                Strip,
                "archive",
            ),
            (
                "release_download_head",
                req("HEAD", GH, "/cli/cli/releases/download/v2.0.0/gh.tar.gz"),
                Strip,
                "archive",
            ),
            (
                "archive_post",
                req("POST", GH, "/acme/widget/archive/main.tar.gz").bearer(&t),
                Deny(403),
                "archive-method",
            ),
            (
                "archive_put",
                req("PUT", GH, "/acme/widget/archive/main.tar.gz"),
                Deny(403),
                "archive-method",
            ),
            (
                "archive_delete",
                req("DELETE", GH, "/acme/widget/archive/x"),
                Deny(403),
                "archive-method",
            ),
            (
                "release_download_post",
                req("POST", GH, "/cli/cli/releases/download/v2/x"),
                Deny(403),
                "archive-method",
            ),
            (
                "archive_without_file",
                req("GET", GH, "/acme/widget/archive"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "releases_page_not_download",
                req("GET", GH, "/cli/cli/releases"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "releases_download_without_file",
                req("GET", GH, "/cli/cli/releases/download"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "archive_case_changed",
                req("GET", GH, "/acme/widget/ARCHIVE/x.tar.gz"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "archive_dot_dot_escape",
                req(
                    "GET",
                    GH,
                    "/acme/widget/archive/../../../evil/exfil/git-upload-pack",
                ),
                Deny(403),
                "target-invalid",
            ),
            (
                "web_page_of_repo",
                req("GET", GH, "/acme/widget"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "login_page",
                req("GET", GH, "/login"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "root",
                req("GET", GH, "/"),
                Deny(403),
                "code-host-default-deny",
            ),
        ],
    );
}

#[test]
fn api_host_carve_outs() {
    let f = Fixture::new();
    let t = f.code_token();
    let g = |q: &str| serde_json::json!({ "query": q }).to_string();
    check(&f, &[
        ("api_root", req("GET", API, "/").bearer(&t), Swap, "api-root"),
        ("api_root_post", req("POST", API, "/").bearer(&t), Deny(403), "code-host-default-deny"),
        ("graphql_viewer_login", req("POST", API, "/graphql").bearer(&t).body(&viewer()), Swap, "graphql-viewer"),
        ("graphql_viewer_shorthand", req("POST", API, "/graphql").bearer(&t).body(&g("{viewer{login}}")), Swap, "graphql-viewer"),
        ("graphql_viewer_with_comments", req("POST", API, "/graphql").bearer(&t).body(&g("# hi\n{ viewer { login } }")), Swap, "graphql-viewer"),
        ("graphql_alias_selecting_more", req("POST", API, "/graphql").bearer(&t).body(&g("{ viewer { login } r: repository(owner:\"evil\",name:\"x\"){id} }")), Deny(403), "graphql-refused"),
        ("graphql_alias_of_login", req("POST", API, "/graphql").bearer(&t).body(&g("{ viewer { login: email } }")), Deny(403), "graphql-refused"),
        ("graphql_extra_field", req("POST", API, "/graphql").bearer(&t).body(&g("{ viewer { login email } }")), Deny(403), "graphql-refused"),
        ("graphql_fragment", req("POST", API, "/graphql").bearer(&t).body(&g("{ viewer { ...F } } fragment F on User { login email }")), Deny(403), "graphql-refused"),
        ("graphql_mutation", req("POST", API, "/graphql").bearer(&t).body(&g("mutation { createRepository(input:{}) { clientMutationId } }")), Deny(403), "graphql-refused"),
        ("graphql_mutation_with_viewer_shape", req("POST", API, "/graphql").bearer(&t).body(&g("mutation { viewer { login } }")), Deny(403), "graphql-refused"),
        ("graphql_subscription", req("POST", API, "/graphql").bearer(&t).body(&g("subscription { viewer { login } }")), Deny(403), "graphql-refused"),
        ("graphql_pr_creation", req("POST", API, "/graphql").bearer(&t).body(&g("mutation { createPullRequest(input:{repositoryId:\"x\",baseRefName:\"main\",headRefName:\"svc/x\",title:\"t\"}) { pullRequest { url } } }")), Deny(403), "graphql-refused"),
        ("graphql_two_operations", req("POST", API, "/graphql").bearer(&t).body(&serde_json::json!({"query": "query A { viewer { login } } mutation B { x }", "operationName": "A"}).to_string()), Deny(403), "graphql-refused"),
        ("graphql_batched", req("POST", API, "/graphql").bearer(&t).body(&format!("[{}]", viewer())), Deny(403), "graphql-refused"),
        ("graphql_variables", req("POST", API, "/graphql").bearer(&t).body(r#"{"query":"query($o:String!){ viewer { login } }","variables":{"o":"x"}}"#), Deny(403), "graphql-refused"),
        ("graphql_duplicate_query_key", req("POST", API, "/graphql").bearer(&t).body(r#"{"query":"{viewer{login}}","query":"mutation{x}"}"#), Deny(403), "graphql-refused"),
        ("graphql_not_json", req("POST", API, "/graphql").bearer(&t).body("query={viewer{login}}"), Deny(403), "graphql-refused"),
        ("graphql_gzip", req("POST", API, "/graphql").bearer(&t).header("Content-Encoding", "gzip").body(&viewer()), Deny(403), "graphql-refused"),
        ("graphql_identity_encoding_ok", req("POST", API, "/graphql").bearer(&t).header("Content-Encoding", "identity").body(&viewer()), Swap, "graphql-viewer"),
        ("graphql_too_large", req("POST", API, "/graphql").bearer(&t).body(&viewer()).incomplete(), Deny(403), "graphql-refused"),
        ("graphql_get_with_query_in_url", req("GET", API, "/graphql?query=%7Bviewer%7Blogin%7D%7D").bearer(&t), Deny(403), "graphql-refused"),
        ("graphql_trailing_slash", req("POST", API, "/graphql/").bearer(&t).body(&viewer()), Deny(403), "code-host-default-deny"),
        ("graphql_case_changed", req("POST", API, "/GraphQL").bearer(&t).body(&viewer()), Deny(403), "code-host-default-deny"),
        ("rest_pr_create_bound", req("POST", API, "/repos/acme/widget/pulls").bearer(&t).body(r#"{"title":"t","head":"svc/x","base":"main","body":"b"}"#), Swap, "rest-bound-repo"),
        ("rest_pr_create_bound_case", req("POST", API, "/repos/ACME/widget/pulls").bearer(&t), Swap, "rest-bound-repo"),
        ("rest_pr_create_foreign", req("POST", API, "/repos/evil/exfil/pulls").bearer(&t), Deny(403), "code-host-default-deny"),
        ("rest_read_bound", req("GET", API, "/repos/acme/widget/pulls/1").bearer(&t), Swap, "rest-bound-repo"),
        ("rest_read_bound_repo_itself", req("GET", API, "/repos/acme/widget").bearer(&t), Swap, "rest-bound-repo"),
        ("rest_read_foreign", req("GET", API, "/repos/evil/exfil/contents/secret").bearer(&t), Deny(403), "code-host-default-deny"),
        ("rest_delete_bound", req("DELETE", API, "/repos/acme/widget").bearer(&t), Deny(403), "code-host-default-deny"),
        ("rest_patch_bound", req("PATCH", API, "/repos/acme/widget").bearer(&t), Deny(403), "code-host-default-deny"),
        ("rest_create_repo", req("POST", API, "/user/repos").bearer(&t), Deny(403), "code-host-default-deny"),
        ("rest_user", req("GET", API, "/user").bearer(&t), Deny(403), "code-host-default-deny"),
        ("rest_pulls_dot_dot", req("POST", API, "/repos/acme/widget/../../evil/exfil/pulls").bearer(&t), Deny(403), "target-invalid"),
        ("rest_pulls_encoded_slash", req("POST", API, "/repos/acme%2fwidget/x/pulls").bearer(&t), Deny(403), "target-invalid"),
    ]);
}

#[test]
fn uploads_host() {
    let f = Fixture::new();
    let t = f.code_token();
    check(
        &f,
        &[
            (
                "asset_upload_bound",
                req(
                    "POST",
                    UP,
                    "/repos/acme/widget/releases/42/assets?name=x.tar.gz",
                )
                .bearer(&t),
                Swap,
                "uploads-bound-repo",
            ),
            (
                "asset_upload_foreign",
                req("POST", UP, "/repos/evil/exfil/releases/42/assets?name=x").bearer(&t),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "asset_get",
                req("GET", UP, "/repos/acme/widget/releases/42/assets").bearer(&t),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "uploads_root",
                req("GET", UP, "/").bearer(&t),
                Deny(403),
                "code-host-default-deny",
            ),
        ],
    );
}

#[test]
fn archive_host_is_never_policy_gated() {
    let f = Fixture::new();
    check(
        &f,
        &[
            (
                "codeload_any_path",
                req(
                    "GET",
                    "codeload.github.com",
                    "/acme/widget/tar.gz/refs/heads/main",
                ),
                Pass,
                "open-host",
            ),
            (
                "codeload_post_is_open_too",
                req("POST", "codeload.github.com", "/x"),
                Pass,
                "open-host",
            ),
        ],
    );
}

#[test]
fn carve_outs_apply_under_generic_egress_policy_without_repo() {
    // No --repo: github.com family gated by egress.policy paths alone.
    let yaml = "egress:\n  policy:\n    github.com:\n      paths: [\"/acme/**\"]\n      repos: [acme/widget]\n    api.github.com:\n      paths: [\"/repos/acme/widget/issues\"]\n";
    let f = Fixture::with(None, yaml);
    check(
        &f,
        &[
            (
                "smart_http_listed_repo",
                req("POST", GH, "/acme/widget.git/git-upload-pack"),
                Pass,
                "smart-http",
            ),
            (
                "smart_http_foreign_repo_despite_paths",
                req("POST", GH, "/evil/exfil.git/git-upload-pack"),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "smart_http_same_owner_unlisted_repo_despite_glob",
                req("POST", GH, "/acme/other.git/git-receive-pack"),
                Deny(403),
                "smart-http-foreign-repo",
            ),
            (
                "archive_post_despite_paths",
                req("POST", GH, "/acme/widget/archive/x.tar.gz"),
                Deny(403),
                "archive-method",
            ),
            (
                "archive_get",
                req("GET", GH, "/acme/widget/archive/x.tar.gz"),
                Strip,
                "archive",
            ),
            (
                "generic_path_allowed",
                req("GET", GH, "/acme/widget/blob/main/README.md"),
                Pass,
                "policy-path",
            ),
            (
                "generic_path_outside",
                req("GET", GH, "/evil/x"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "api_root_still_allowed",
                req("GET", API, "/"),
                Pass,
                "api-root",
            ),
            (
                "api_graphql_viewer_still_allowed",
                req("POST", API, "/graphql").body(&viewer()),
                Pass,
                "graphql-viewer",
            ),
            (
                "api_other_graphql_denied",
                req("POST", API, "/graphql")
                    .body(&serde_json::json!({"query":"{ viewer { email } }"}).to_string()),
                Deny(403),
                "graphql-refused",
            ),
            (
                "api_generic_path",
                req("POST", API, "/repos/acme/widget/issues"),
                Pass,
                "policy-path",
            ),
            (
                "api_generic_path_other",
                req("POST", API, "/repos/acme/widget/hooks"),
                Deny(403),
                "code-host-default-deny",
            ),
            (
                "uploads_not_in_allowlist",
                req("POST", UP, "/repos/acme/widget/releases/1/assets"),
                Deny(403),
                "host-not-allowed",
            ),
        ],
    );
}

#[test]
fn code_host_without_repo_or_policy_is_not_reachable() {
    let f = Fixture::with(None, "");
    check(
        &f,
        &[
            (
                "code_host_not_allowed",
                req("GET", GH, "/acme/widget/info/refs?service=git-upload-pack"),
                Deny(403),
                "host-not-allowed",
            ),
            (
                "api_host_not_allowed",
                req("GET", API, "/"),
                Deny(403),
                "host-not-allowed",
            ),
        ],
    );
}
