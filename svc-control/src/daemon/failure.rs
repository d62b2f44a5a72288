//! The API's failure type: a stable code, an HTTP status and a message for people.

use crate::{api, store::StoreError};

/// An API failure: a stable code, an HTTP status, a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Failure {
    pub fn bad(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            code: "bad-request",
            message: message.into(),
        }
    }
    pub fn not_found(name: &str) -> Self {
        Self {
            status: 404,
            code: "not-found",
            message: format!("no sandbox named {name:?} (svc sandbox list shows them)"),
        }
    }
    /// 409: sandbox `name` is being made (`state` `creating`) or destroyed now.
    pub fn busy(name: &str, state: &str) -> Self {
        Self {
            status: 409,
            code: "busy",
            message: if state == "creating" {
                format!(
                    "sandbox {name:?} is still being created: destroy it once its creation has answered"
                )
            } else {
                format!("sandbox {name:?} is already being destroyed")
            },
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            code: "internal",
            message: message.into(),
        }
    }
    /// 403: the caller may not do this (another user's sandbox or secret, …).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self {
            status: 403,
            code: "forbidden",
            message: message.into(),
        }
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self {
            status: 409,
            code: "unsupported",
            message: message.into(),
        }
    }
    /// 429: the sandbox is at one of its `[limits]` caps (the message names the key).
    pub fn limited(hit: &crate::limits::LimitHit) -> Self {
        Self {
            status: 429,
            code: "limit",
            message: hit.to_string(),
        }
    }
    pub fn to_api(&self) -> api::ApiError {
        api::ApiError {
            code: self.code.to_owned(),
            error: self.message.clone(),
        }
    }
}

impl From<crate::policy::ownership::OwnershipError> for Failure {
    fn from(e: crate::policy::ownership::OwnershipError) -> Self {
        use crate::policy::ownership::OwnershipError;
        match e {
            OwnershipError::SecretHidden { .. } => Self {
                status: 404,
                code: "not-found",
                message: e.to_string(),
            },
            OwnershipError::SecretNameTaken { .. } => Self {
                status: 409,
                code: "exists",
                message: e.to_string(),
            },
            _ => Self::forbidden(e.to_string()),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Exists(n) => Self {
                status: 409,
                code: "exists",
                message: format!("a sandbox named {n:?} already exists"),
            },
            StoreError::NotFound(n) => Self::not_found(&n),
            StoreError::SecretExists(n) => Self {
                status: 409,
                code: "exists",
                message: format!(
                    "a secret named {n:?} already exists: give it a new value with `svc secret rotate {n}`"
                ),
            },
            StoreError::SecretNotFound(n) => Self {
                status: 404,
                code: "not-found",
                message: format!("no secret named {n:?} (svc secret list shows them)"),
            },
            StoreError::Full(n) => Self {
                status: 507,
                code: "full",
                message: format!("all {n} sandbox slots of the address pool are in use"),
            },
            other => Self::internal(other.to_string()),
        }
    }
}
