//! Compose's variable interpolation (`$VAR`, `${VAR:-default}`, …) over the environment.

use std::collections::BTreeMap;

/// Variables for interpolation: the process environment over the workspace's `.env` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    vars: BTreeMap<String, String>,
}

impl Environment {
    /// `.env` values, then `process` values on top (Compose: the shell wins over `.env`).
    pub fn new(
        dotenv: BTreeMap<String, String>,
        process: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        let mut vars = dotenv;
        vars.extend(process);
        Self { vars }
    }
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }
}

/// Interpolate one string the way Compose does: `$$` is a literal `$`; `$VAR`, `${VAR}`;
/// `${VAR:-default}` (unset or empty), `${VAR-default}` (unset); `${VAR:?message}`,
/// `${VAR?message}` (error); `${VAR:+alt}`, `${VAR+alt}`. Defaults may nest. An unset
/// variable without a default becomes the empty string, as in Compose.
pub fn interpolate(input: &str, env: &Environment) -> Result<String, String> {
    let mut out = String::with_capacity(input.len());
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' {
            let next = input[i..].find('$').map_or(input.len(), |n| i + n);
            out.push_str(&input[i..next]);
            i = next;
            continue;
        }
        match bytes.get(i + 1) {
            Some(b'$') => {
                out.push('$');
                i += 2;
            }
            Some(b'{') => {
                let close = matching_brace(input, i + 1).ok_or_else(|| {
                    format!("invalid interpolation format for {input:?}: unterminated '${{'")
                })?;
                out.push_str(&expand_braced(&input[i + 2..close], env, input)?);
                i = close + 1;
            }
            Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {
                let end = input[i + 1..]
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .map_or(input.len(), |n| i + 1 + n);
                out.push_str(env.get(&input[i + 1..end]).unwrap_or(""));
                i = end;
            }
            _ => {
                out.push('$');
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Index of the `}` matching the `{` at `open`, counting nested `${`.
fn matching_brace(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (j, b) in s.bytes().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

fn expand_braced(body: &str, env: &Environment, whole: &str) -> Result<String, String> {
    let name_end = body
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(body.len());
    let name = &body[..name_end];
    let rest = &body[name_end..];
    if name.is_empty() || name.as_bytes()[0].is_ascii_digit() {
        return Err(format!(
            "invalid interpolation format for {whole:?}: bad variable name in '${{{body}}}'"
        ));
    }
    let value = env.get(name);
    let set_nonempty = value.is_some_and(|v| !v.is_empty());
    let (op, arg) = match rest {
        "" => return Ok(value.unwrap_or("").to_owned()),
        r if r.starts_with(":-") || r.starts_with(":?") || r.starts_with(":+") => {
            (&r[..2], &r[2..])
        }
        r if r.starts_with('-') || r.starts_with('?') || r.starts_with('+') => (&r[..1], &r[1..]),
        _ => {
            return Err(format!(
                "invalid interpolation format for {whole:?}: unexpected {rest:?} after variable {name}"
            ));
        }
    };
    let present = if op.starts_with(':') {
        set_nonempty
    } else {
        value.is_some()
    };
    match op.trim_start_matches(':') {
        "-" => {
            if present {
                Ok(value.unwrap_or("").to_owned())
            } else {
                interpolate(arg, env)
            }
        }
        "+" => {
            if present {
                interpolate(arg, env)
            } else {
                Ok(String::new())
            }
        }
        _ => {
            if present {
                Ok(value.unwrap_or("").to_owned())
            } else {
                let msg = interpolate(arg, env)?;
                Err(format!(
                    "required variable {name} is missing a value: {msg}"
                ))
            }
        }
    }
}
