//! Compose fallback: every published-port form of the Compose specification, interpolation,
//! `.env`, profiles, and refusals.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::{collections::BTreeMap, net::IpAddr, path::Path};

use svc_control::config::compose::{self, ComposeForward, Environment, Protocol};

fn env(vars: &[(&str, &str)]) -> Environment {
    Environment::new(
        BTreeMap::new(),
        vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    )
}

/// (remote port, local port, host address, protocol) of one forward.
type Fwd = (u16, u16, Option<IpAddr>, Protocol);

fn ports(yaml_ports: &str, e: &Environment) -> Vec<Fwd> {
    let text = format!("services:\n  app:\n    image: x\n    ports:\n{yaml_ports}");
    compose::parse(Path::new("compose.yaml"), &text, e)
        .unwrap_or_else(|err| panic!("{yaml_ports}: {err}"))
        .forwards
        .into_iter()
        .map(|f: ComposeForward| (f.remote_port, f.local_port, f.host_ip, f.protocol))
        .collect()
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

#[test]
fn short_syntax_forms() {
    use Protocol::{Tcp, Udp};
    let e = env(&[]);
    let cases: Vec<(&str, &str, Vec<Fwd>)> = vec![
        (
            "container_only",
            "      - \"3000\"\n",
            vec![(3000, 3000, None, Tcp)],
        ),
        (
            "host_to_container",
            "      - \"8000:80\"\n",
            vec![(80, 8000, None, Tcp)],
        ),
        (
            "container_range",
            "      - \"3000-3002\"\n",
            vec![
                (3000, 3000, None, Tcp),
                (3001, 3001, None, Tcp),
                (3002, 3002, None, Tcp),
            ],
        ),
        (
            "range_to_range",
            "      - \"9090-9091:8080-8081\"\n",
            vec![(8080, 9090, None, Tcp), (8081, 9091, None, Tcp)],
        ),
        (
            "ip_range_to_range",
            "      - \"127.0.0.1:5000-5001:5000-5001\"\n",
            vec![
                (5000, 5000, ip("127.0.0.1"), Tcp),
                (5001, 5001, ip("127.0.0.1"), Tcp),
            ],
        ),
        (
            "ipv6_host_ip",
            "      - \"[::1]:6001:6001\"\n",
            vec![(6001, 6001, ip("::1"), Tcp)],
        ),
        (
            "udp_protocol",
            "      - \"6060:6060/udp\"\n",
            vec![(6060, 6060, None, Udp)],
        ),
        (
            "ip_with_ephemeral_host_port",
            "      - \"127.0.0.1::5000\"\n",
            vec![(5000, 5000, ip("127.0.0.1"), Tcp)],
        ),
        (
            "ip_host_container",
            "      - \"127.0.0.1:8001:8001\"\n",
            vec![(8001, 8001, ip("127.0.0.1"), Tcp)],
        ),
        (
            "host_range_single_container",
            "      - \"8000-8010:80\"\n",
            vec![(80, 8000, None, Tcp)],
        ),
        (
            "bare_integer",
            "      - 3000\n",
            vec![(3000, 3000, None, Tcp)],
        ),
        (
            "protocol_upper_case",
            "      - \"53:53/UDP\"\n",
            vec![(53, 53, None, Udp)],
        ),
    ];
    for (name, yaml, expected) in cases {
        assert_eq!(ports(yaml, &e), expected, "{name}");
    }
}

#[test]
fn long_syntax_forms() {
    use Protocol::{Tcp, Udp};
    let e = env(&[]);
    let cases: Vec<(&str, &str, Vec<Fwd>)> = vec![
        (
            "target_only",
            "      - target: 80\n",
            vec![(80, 80, None, Tcp)],
        ),
        (
            "target_published_number",
            "      - target: 80\n        published: 8080\n",
            vec![(80, 8080, None, Tcp)],
        ),
        (
            "published_string",
            "      - target: 80\n        published: \"8080\"\n",
            vec![(80, 8080, None, Tcp)],
        ),
        (
            "published_range",
            "      - target: 80\n        published: \"8080-8081\"\n",
            vec![(80, 8080, None, Tcp)],
        ),
        (
            "all_fields",
            "      - name: web\n        target: 80\n        host_ip: 127.0.0.1\n        published: \"8080\"\n        protocol: udp\n        mode: host\n        app_protocol: http\n",
            vec![(80, 8080, ip("127.0.0.1"), Udp)],
        ),
        (
            "ingress_mode",
            "      - target: 443\n        published: 8443\n        mode: ingress\n",
            vec![(443, 8443, None, Tcp)],
        ),
        (
            "extension_key",
            "      - target: 80\n        x-note: hi\n",
            vec![(80, 80, None, Tcp)],
        ),
    ];
    for (name, yaml, expected) in cases {
        assert_eq!(ports(yaml, &e), expected, "{name}");
    }
}

#[test]
fn interpolation_forms() {
    let e = env(&[("PORT", "9000"), ("EMPTY", ""), ("HOST_IP", "127.0.0.1")]);
    let cases: &[(&str, &str, &str)] = &[
        ("braced", "${PORT}:80", "9000:80"),
        ("bare", "$PORT:80", "9000:80"),
        ("default_when_unset", "${NOPE:-7000}:80", "7000:80"),
        ("colon_default_when_empty", "${EMPTY:-7001}:80", "7001:80"),
        ("dash_default_keeps_empty", "x${EMPTY-7002}y", "xy"),
        ("dash_default_when_unset", "${NOPE-7003}:80", "7003:80"),
        ("nested_default", "${NOPE:-${PORT}}:80", "9000:80"),
        ("plus_alternative_when_set", "${PORT:+1234}", "1234"),
        ("plus_alternative_when_unset", "a${NOPE+1234}b", "ab"),
        ("double_dollar_is_literal", "$$PORT", "$PORT"),
        ("unset_without_default_is_empty", "a${NOPE}b", "ab"),
        ("lone_dollar", "a$ b", "a$ b"),
        ("host_ip_var", "${HOST_IP}:8080:8080", "127.0.0.1:8080:8080"),
    ];
    for (name, input, expected) in cases {
        assert_eq!(
            compose::interpolate(input, &e).as_deref(),
            Ok(*expected),
            "{name}"
        );
    }
    let refused: &[(&str, &str, &str)] = &[
        (
            "required_colon",
            "${NOPE:?set NOPE}",
            "required variable NOPE is missing a value: set NOPE",
        ),
        (
            "required_colon_empty",
            "${EMPTY:?must not be empty}",
            "required variable EMPTY",
        ),
        ("required_plain", "${NOPE?gone}", "required variable NOPE"),
        ("unterminated", "${PORT", "unterminated"),
        ("bad_name", "${1X}", "bad variable name"),
        ("bad_operator", "${PORT/x}", "unexpected"),
    ];
    for (name, input, fragment) in refused {
        let err = compose::interpolate(input, &e).expect_err(name);
        assert!(err.contains(fragment), "{name}: {err}");
    }
}

#[test]
fn process_environment_overrides_dotenv() {
    let dotenv = compose::parse_dotenv(Path::new(".env"), "PORT=1111\nOTHER=2222\n").unwrap();
    let e = Environment::new(dotenv, [("PORT".to_owned(), "3333".to_owned())]);
    assert_eq!(e.get("PORT"), Some("3333"));
    assert_eq!(e.get("OTHER"), Some("2222"));
}

#[test]
fn dotenv_syntax() {
    let text = "# comment\n\nexport A=1\nB = two words \nC=\"quoted # not a comment\\nnext\"\nD='single $NOT'\nE=value # trailing comment\nF=\n";
    let vars = compose::parse_dotenv(Path::new(".env"), text).unwrap();
    assert_eq!(vars["A"], "1");
    assert_eq!(vars["B"], "two words");
    assert_eq!(vars["C"], "quoted # not a comment\nnext");
    assert_eq!(vars["D"], "single $NOT");
    assert_eq!(vars["E"], "value");
    assert_eq!(vars["F"], "");
    let bad = compose::parse_dotenv(Path::new(".env"), "OK=1\nno equals sign\nX=\"open\n")
        .unwrap_err()
        .0;
    assert_eq!(bad.len(), 2);
    assert_eq!(bad[0].location.line, Some(2));
    assert_eq!(bad[1].location.line, Some(3));
}

#[test]
fn profiles_expose_and_services_without_ports() {
    let text = "services:\n  web:\n    image: x\n    ports: [\"80:80\"]\n    expose: [\"9000\"]\n  debug:\n    image: x\n    profiles: [debug]\n    ports: [\"2345:2345\"]\n  tools:\n    image: x\n    profiles: [tools, debug]\n    ports: [\"7000:7000\"]\n  worker:\n    image: x\n";
    let none = compose::parse(Path::new("compose.yaml"), text, &env(&[])).unwrap();
    let got: Vec<(String, u16)> = none
        .forwards
        .iter()
        .map(|f| (f.service.clone(), f.local_port))
        .collect();
    assert_eq!(
        got,
        [("web".to_owned(), 80)],
        "expose is never published; inactive profiles skipped"
    );
    assert_eq!(none.inactive_services, ["debug", "tools"]);

    let debug = compose::parse(
        Path::new("compose.yaml"),
        text,
        &env(&[("COMPOSE_PROFILES", "debug")]),
    )
    .unwrap();
    let mut services: Vec<&str> = debug.forwards.iter().map(|f| f.service.as_str()).collect();
    services.sort_unstable();
    assert_eq!(services, ["debug", "tools", "web"]);
}

#[test]
fn yaml_merge_keys_are_applied() {
    let text =
        "x-base: &base\n  image: x\n  ports: [\"8080:80\"]\nservices:\n  a:\n    <<: *base\n";
    let got = compose::parse(Path::new("compose.yaml"), text, &env(&[])).unwrap();
    assert_eq!(got.forwards.len(), 1);
    assert_eq!(got.forwards[0].local_port, 8080);
}

#[test]
fn refusals_name_the_service_and_port() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "port_zero",
            "\"0:80\"",
            "services.app.ports[0]",
            "1 to 65535",
        ),
        (
            "port_too_big",
            "\"70000:80\"",
            "services.app.ports[0]",
            "1 to 65535",
        ),
        (
            "not_a_number",
            "\"http:80\"",
            "services.app.ports[0]",
            "not a port number",
        ),
        (
            "ranges_differ",
            "\"8000-8002:80-81\"",
            "services.app.ports[0]",
            "differ in length",
        ),
        (
            "range_backwards",
            "\"81-80\"",
            "services.app.ports[0]",
            "backwards",
        ),
        (
            "bad_protocol",
            "\"80/http\"",
            "services.app.ports[0]",
            "tcp, udp or sctp",
        ),
        (
            "bad_host_ip",
            "\"1.2.3:80:80\"",
            "services.app.ports[0]",
            "not an IP address",
        ),
        (
            "unbracketed_ipv6",
            "\"::1:80:80\"",
            "services.app.ports[0]",
            "brackets",
        ),
        (
            "required_var_missing",
            "\"${MUST:?set MUST}:80\"",
            "services.app.ports[0]",
            "required variable MUST",
        ),
        (
            "long_without_target",
            "{published: 80}",
            "services.app.ports[0]",
            "needs `target`",
        ),
        (
            "long_unknown_key",
            "{target: 80, pubilshed: 8080}",
            "services.app.ports[0]",
            "unknown key",
        ),
        (
            "long_bad_mode",
            "{target: 80, mode: bridge}",
            "services.app.ports[0]",
            "host or ingress",
        ),
        ("list_entry", "[80]", "services.app.ports[0]", "got a list"),
        (
            "negative_number",
            "-1",
            "services.app.ports[0]",
            "1 to 65535",
        ),
    ];
    for (name, entry, path, fragment) in cases {
        let text = format!("services:\n  app:\n    image: x\n    ports:\n      - {entry}\n");
        let errors = compose::parse(Path::new("compose.yaml"), &text, &env(&[]))
            .expect_err(name)
            .0;
        assert!(
            errors
                .iter()
                .any(|e| e.location.path == *path && e.message.contains(fragment)),
            "{name}: expected {path} / {fragment:?}, got {errors:#?}"
        );
    }
}

#[test]
fn malformed_files_are_refused_with_a_location() {
    let cases: &[(&str, &str)] = &[
        ("services_is_a_list", "services: [a, b]\n"),
        (
            "ports_not_a_list",
            "services:\n  a:\n    ports: \"80:80\"\n",
        ),
        ("broken_yaml", "services:\n  a: [\n"),
        ("duplicate_service", "services:\n  a: {}\n  a: {}\n"),
        (
            "profiles_not_a_list",
            "services:\n  a:\n    profiles: debug\n",
        ),
    ];
    for (name, text) in cases {
        let errors = compose::parse(Path::new("compose.yaml"), text, &env(&[]))
            .expect_err(name)
            .0;
        assert!(
            errors.iter().all(|e| e.file == Path::new("compose.yaml")),
            "{name}"
        );
    }
}

#[test]
fn empty_and_serviceless_files_yield_no_forwards() {
    for text in ["services:\n", "version: \"3\"\n", "services: {}\n"] {
        let got = compose::parse(Path::new("compose.yaml"), text, &env(&[])).unwrap();
        assert!(got.forwards.is_empty(), "{text}");
    }
}
