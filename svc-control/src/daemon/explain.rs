//! `POST /v1/sandboxes/{name}/explain`: how the sandbox's perimeter decides one request as it
//! stands now (after live allowlist changes), by the proxy's own decision function. A read: it
//! changes nothing and reaches nothing; the sandbox's owner's or root's, like `show`.

use http::{Request, StatusCode};
use hyper::body::Incoming;

use super::{
    http::{Body, json, read_json},
    supervisor::{Failure, Supervisor},
};
use crate::policy::explain::{self, ExplainRequest, Explained, Verdict};

/// Decide the request in `req`'s body against sandbox `name`'s live policy.
pub(super) async fn explain(
    sup: &Supervisor,
    name: &str,
    req: Request<Incoming>,
) -> Result<http::Response<Body>, Failure> {
    let asked = read_json::<ExplainRequest>(req).await?;
    let (policy, sandbox) = sup.policy_now(name)?;
    // On an AllowAll link no proxy decides: the fence alone refuses its destination classes.
    let decision = if sandbox.is_curated() {
        let d = explain::explain(&policy, &asked).map_err(|e| Failure::bad(e.to_string()))?;
        Verdict::from(&d)
    } else {
        explain::allow_all(sandbox.window_ends.as_deref())
    };
    Ok(json(StatusCode::OK, &Explained { decision, sandbox }))
}
