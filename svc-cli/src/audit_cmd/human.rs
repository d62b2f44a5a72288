//! `svc audit`'s line for people, built from the typed record: time, sandbox, layer, verdict,
//! then what the layer says (one small renderer per layer). A line that is JSON but not a
//! record this version knows (a layer added later) is shown whole after the same columns.

use serde_json::Value;
use svc_control::audit::{
    AuditEvent, AuditRecord, CredentialEvent, DnsEvent, HttpEvent, PacketEvent, PolicyEvent,
    SshEvent, SuppressedEvent,
    query::{self, Verdict},
};

/// One line of the audit log for people; `None` for a line that is not JSON.
pub fn line(raw: &[u8]) -> Option<String> {
    match serde_json::from_slice::<AuditRecord>(raw) {
        Ok(record) => Some(record_line(&record)),
        Err(_) => serde_json::from_slice::<Value>(raw)
            .ok()
            .map(|r| unknown_line(&r)),
    }
}

/// A known record.
fn record_line(r: &AuditRecord) -> String {
    let mut sandbox = r
        .sandbox_name
        .clone()
        .unwrap_or_else(|| format!("#{}", r.sandbox));
    if let Some(pod) = &r.pod {
        sandbox = format!("{sandbox} pod={pod}");
    }
    let verdict = r.event.decision_word().map(Verdict::of_word);
    let what = match &r.event {
        AuditEvent::Packet(p) => packet(p),
        AuditEvent::Dns(d) => dns(d),
        AuditEvent::Http(h) => http(h),
        AuditEvent::Ssh(s) => ssh(s),
        AuditEvent::Policy(p) => policy(p),
        AuditEvent::Credential(c) => credential(c),
        AuditEvent::Suppressed(s) => suppressed(s),
    };
    columns(&r.time, &sandbox, r.event.layer().as_str(), verdict, &what)
}

/// A JSON line that is no record this version reads: its columns as far as they go, then the
/// whole line.
fn unknown_line(r: &Value) -> String {
    let text = |k: &str| r[k].as_str().unwrap_or("");
    let sandbox = r["sandbox_name"]
        .as_str()
        .map_or_else(|| format!("#{}", r["sandbox"]), str::to_owned);
    let layer = text("layer");
    let what = format!("{layer} {r}");
    columns(text("time"), &sandbox, layer, query::verdict(r), &what)
}

/// The line: the columns every layer shares, then `what`.
fn columns(time: &str, sandbox: &str, layer: &str, verdict: Option<Verdict>, what: &str) -> String {
    let verdict = match verdict {
        Some(Verdict::Allow) => "ALLOW",
        Some(Verdict::Deny) => "DENY",
        None => "?",
    };
    format!("{time} {sandbox:<16} {layer:<6} {verdict:<5} {what}")
}

/// `: why`, or nothing.
fn because(reason: Option<&str>) -> String {
    reason.map_or(String::new(), |why| format!(": {why}"))
}

/// `PREFIXa,b,c`, or nothing for no items.
fn listed(prefix: &str, items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        String::new()
    } else {
        format!("{prefix}{}", items.join(","))
    }
}

fn packet(p: &PacketEvent) -> String {
    let end = |addr: Option<std::net::IpAddr>, port: Option<u16>| {
        let addr = addr.map(|a| a.to_string()).unwrap_or_default();
        match port {
            Some(port) => format!("{addr}:{port}"),
            None => addr,
        }
    };
    let suppressed = if p.suppressed == 0 {
        String::new()
    } else {
        format!(" (+{} suppressed)", p.suppressed)
    };
    format!(
        "{} {} -> {} {}{suppressed}",
        p.protocol.as_deref().unwrap_or(""),
        end(p.src, p.src_port),
        end(p.dst, p.dst_port),
        p.reason,
    )
}

fn dns(d: &DnsEvent) -> String {
    let answers = listed(" ", d.answers.iter().map(ToString::to_string));
    format!(
        "{} {} {}{answers}{}",
        d.name,
        d.qtype,
        d.decision,
        because(d.reason.as_deref())
    )
}

fn http(h: &HttpEvent) -> String {
    format!(
        "{} {}{} {} {} credential={} up={}B down={}B {}ms",
        h.method,
        h.host.as_deref().unwrap_or(""),
        h.path.as_deref().unwrap_or(""),
        h.status,
        h.rule,
        h.credential,
        h.bytes_up,
        h.bytes_down,
        h.duration_ms
    )
}

fn ssh(s: &SshEvent) -> String {
    let refs = listed(" refs=", s.refs.iter().map(|r| r.name.clone()));
    format!(
        "{} {} {}{refs} exit={} up={}B down={}B {}ms{}",
        s.command,
        s.host,
        s.repo,
        s.exit,
        s.bytes_up,
        s.bytes_down,
        s.duration_ms,
        because(s.reason.as_deref())
    )
}

fn policy(p: &PolicyEvent) -> String {
    format!(
        "{} +[{}] -[{}] generation={} by {}",
        p.change,
        p.added.join(","),
        p.removed.join(","),
        p.generation,
        p.by
    )
}

fn credential(c: &CredentialEvent) -> String {
    format!(
        "{} {} until {}{}",
        c.credential,
        c.outcome,
        c.expires_at,
        because(c.reason.as_deref())
    )
}

fn suppressed(s: &SuppressedEvent) -> String {
    let counts: Vec<String> = s
        .records
        .iter()
        .map(|(layer, n)| format!("{layer}={n}"))
        .collect();
    format!(
        "{} records not written (past {}/s, bursts of {}: limits.audit_records_per_sec)",
        counts.join(" "),
        s.per_sec,
        s.burst
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One line of each layer as svcd writes them, and lines this version does not know.
    const SAMPLES: [&str; 12] = [
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"sandbox_name":"dev","layer":"packet","verdict":"drop","reason":"drop_tcp_not_allowed","protocol":"tcp","src":"10.203.0.2","dst":"192.0.2.66","src_port":40312,"dst_port":443,"link":7}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"layer":"packet","verdict":"drop","reason":"drop_not_ip","link":7,"suppressed":12}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"sandbox_name":"dev","layer":"packet","verdict":"drop","reason":"drop_udp_not_allowed","protocol":"udp","src":"fd00::2","dst":"2001:db8::1","src_port":5353,"dst_port":53,"link":7}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"sandbox_name":"dev","layer":"dns","name":"allowed.example.test.","qtype":"A","decision":"answered","answers":["192.0.2.10","2001:db8::10"],"upstream_ms":3}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"sandbox_name":"dev","pod":{"namespace":"team-a","name":"agent-7"},"layer":"dns","name":"forbidden.example.test.","qtype":"AAAA","decision":"refused","reason":"name not allowed for this sandbox"}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"sandbox_name":"a-very-long-sandbox-name","layer":"http","host":"api.code.test","method":"GET","path":"/repos/acme/widget","status":200,"decision":"allow","rule":"code-host-api","credential":"swapped","bytes_up":0,"bytes_down":5120,"duration_ms":84,"dialled":"192.0.2.10:443"}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"layer":"http","host":null,"method":"CONNECT","path":null,"status":0,"decision":"deny","rule":"sni-not-allowed","credential":"none","bytes_up":0,"bytes_down":0,"duration_ms":0}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"sandbox_name":"dev","layer":"ssh","host":"github.com","repo":"acme/widget","command":"git-upload-pack","decision":"allow","bytes_up":10,"bytes_down":2000,"duration_ms":40,"exit":0}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"sandbox_name":"dev","layer":"policy","change":"allowlist","added":["a.test","b.test"],"removed":[],"generation":4,"by":"uid 1001"}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":0,"layer":"credential","credential":"store:gh@v2","outcome":"failed","reason":"token endpoint answered 400","expires_at":"2026-11-22T11:00:00.000Z"}"#,
        r#"{"time":"2026-11-22T10:00:00.000Z","sandbox":3,"sandbox_name":"dev","layer":"smtp","decision":"allow","to":"x"}"#,
        r#"[1,2]"#,
    ];

    /// What `svc audit` has always printed for each of [`SAMPLES`].
    const PRINTED: [&str; 12] = [
        "2026-11-22T10:00:00.000Z dev              packet DENY  tcp 10.203.0.2:40312 -> 192.0.2.66:443 drop_tcp_not_allowed",
        "2026-11-22T10:00:00.000Z #3               packet DENY    ->  drop_not_ip (+12 suppressed)",
        "2026-11-22T10:00:00.000Z dev              packet DENY  udp fd00::2:5353 -> 2001:db8::1:53 drop_udp_not_allowed",
        "2026-11-22T10:00:00.000Z dev              dns    ALLOW allowed.example.test. A answered 192.0.2.10,2001:db8::10",
        "2026-11-22T10:00:00.000Z dev pod=team-a/agent-7 dns    DENY  forbidden.example.test. AAAA refused: name not allowed for this sandbox",
        "2026-11-22T10:00:00.000Z a-very-long-sandbox-name http   ALLOW GET api.code.test/repos/acme/widget 200 code-host-api credential=swapped up=0B down=5120B 84ms",
        "2026-11-22T10:00:00.000Z #3               http   DENY  CONNECT  0 sni-not-allowed credential=none up=0B down=0B 0ms",
        "2026-11-22T10:00:00.000Z dev              ssh    ALLOW git-upload-pack github.com acme/widget exit=0 up=10B down=2000B 40ms",
        "2026-11-22T10:00:00.000Z dev              policy ?     allowlist +[a.test,b.test] -[] generation=4 by uid 1001",
        "2026-11-22T10:00:00.000Z #0               credential ?     store:gh@v2 failed until 2026-11-22T11:00:00.000Z: token endpoint answered 400",
        "2026-11-22T10:00:00.000Z dev              smtp   ALLOW smtp {\"time\":\"2026-11-22T10:00:00.000Z\",\"sandbox\":3,\"sandbox_name\":\"dev\",\"layer\":\"smtp\",\"decision\":\"allow\",\"to\":\"x\"}",
        " #null                   ?      [1,2]",
    ];

    #[test]
    fn every_layer_prints_as_it_always_has_and_other_json_whole() {
        for (sample, printed) in SAMPLES.into_iter().zip(PRINTED) {
            assert_eq!(
                line(sample.as_bytes()).as_deref(),
                Some(printed),
                "{sample}"
            );
        }
        assert_eq!(
            line(b"not json"),
            None,
            "a line that is not JSON is skipped"
        );
    }

    #[test]
    fn an_ssh_record_reads_as_the_session_it_was() {
        let r = serde_json::json!({
            "time": "2026-11-23T08:00:00.000Z", "sandbox": 1, "sandbox_name": "dev",
            "layer": "ssh", "host": "github.com", "repo": "acme/widget",
            "command": "git-receive-pack",
            "refs": [{"name": "refs/heads/main", "old": "0", "new": "1"}],
            "decision": "deny",
            "reason": "svc: refused: ref refs/heads/main not in allowed branches",
            "bytes_up": 0, "bytes_down": 0, "duration_ms": 12, "exit": 1
        });
        let line = line(r.to_string().as_bytes()).expect("a record");
        assert!(
            line.contains(
                " ssh    DENY  git-receive-pack github.com acme/widget refs=refs/heads/main exit=1"
            ),
            "{line}"
        );
        assert!(
            line.ends_with(": svc: refused: ref refs/heads/main not in allowed branches"),
            "{line}"
        );
    }

    #[test]
    fn a_suppressed_record_reads_as_its_counts_and_the_limit() {
        let r = serde_json::json!({
            "time": "2026-11-26T03:00:00.000Z", "sandbox": 1, "sandbox_name": "dev",
            "layer": "suppressed", "records": {"dns": 812, "http": 3},
            "per_sec": 50, "burst": 2000
        });
        let line = line(r.to_string().as_bytes()).expect("a record");
        assert!(
            line.ends_with(
                " suppressed ?     dns=812 http=3 records not written (past 50/s, bursts of \
                 2000: limits.audit_records_per_sec)"
            ),
            "{line}"
        );
    }
}
