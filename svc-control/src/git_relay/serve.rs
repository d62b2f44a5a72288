//! One shim connection, start to end: its request read, the repository checked against the
//! policy, then the session relayed (or refused with a line on git's stderr).

use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite};

use super::{
    carry,
    client::SshClient,
    session::{RelayPolicy, Session},
    shim::{ShimRequest, ToShim, read_request},
};
use crate::policy::ssh::{self, policy_refusal};

/// Answer one shim connection's request with `line` on git's stderr and exit status 1,
/// without looking further (a sandbox with too many sessions).
pub async fn refuse<R, W>(mut reader: R, writer: W, line: &str) -> Result<Session, String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let shim = ToShim::start(writer);
    let read = read_request(&mut reader, &shim.out).await;
    let result = read.map(|ShimRequest { id, args, .. }| {
        shim.refuse(id, line);
        let request = ssh::parse_request(&args).ok();
        Session {
            reason: Some(line.to_owned()),
            duration: started.elapsed(),
            ..Session::asked(request.as_ref())
        }
    });
    shim.finish().await;
    result
}

/// Serve one shim connection.
pub async fn serve<R, W>(
    mut reader: R,
    writer: W,
    policy: &RelayPolicy,
    client: &SshClient,
) -> Result<Session, String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let shim = ToShim::start(writer);
    let asked = match read_request(&mut reader, &shim.out).await {
        Ok(r) => r,
        Err(e) => {
            shim.finish().await;
            return Err(e);
        }
    };
    let id = asked.id;
    let request = match ssh::parse_request(&asked.args) {
        Ok(r) => r,
        Err(e) => {
            let s = shim.deny(
                id,
                started,
                Session::asked(None),
                format!("svc: refused: {e}"),
            );
            shim.finish().await;
            return Ok(s);
        }
    };
    let session = Session::asked(Some(&request));
    if !ssh::repo_allowed(&policy.repos, &request.host, &request.repo) {
        let line = policy_refusal(&request.host, &request.repo);
        let s = shim.deny(id, started, session, line);
        shim.finish().await;
        return Ok(s);
    }
    let session = carry::Carried {
        reader: &mut reader,
        out: &shim.out,
        id,
        request: &request,
        policy,
    }
    .relay(asked.git_protocol, client, session)
    .await;
    let mut session = match session {
        Ok(s) => s,
        Err((s, line)) => shim.deny(id, started, s, line),
    };
    session.duration = started.elapsed();
    shim.finish().await;
    Ok(session)
}
