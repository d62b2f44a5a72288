//! The one GraphQL document the code-host API carve-out allows: a query that
//! selects exactly `viewer { login }`. The body is parsed as strict JSON and the document with
//! a real GraphQL parser (apollo-parser, with recursion and token limits), and the syntax tree
//! is compared, so aliases, extra fields, arguments, directives, fragments, mutations,
//! subscriptions, several operations, variables and batches are all refused whatever the
//! whitespace and comments.

use apollo_parser::{Parser, cst};
use serde::Deserialize;

/// Largest GraphQL body the proxy buffers for this decision; larger bodies are refused.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
const RECURSION_LIMIT: usize = 32;
const TOKEN_LIMIT: usize = 512;

/// The JSON envelope of a GraphQL-over-HTTP POST. Duplicate and unknown keys are refused (a
/// server that takes the first `query` and one that takes the last must never disagree).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    query: String,
    #[serde(default)]
    variables: Option<serde_json::Value>,
    #[serde(default, rename = "operationName")]
    operation_name: Option<String>,
}

/// `Ok` when `body` is exactly a viewer-login query; otherwise why not.
pub fn check_viewer_login(body: &[u8]) -> Result<(), String> {
    if body.len() > MAX_BODY_BYTES {
        return Err(format!("GraphQL body larger than {MAX_BODY_BYTES} bytes"));
    }
    let trimmed = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .map_or(&[][..], |i| &body[i..]);
    if trimmed.first() == Some(&b'[') {
        return Err("batched GraphQL requests are not allowed".into());
    }
    let env: Envelope = serde_json::from_slice(body)
        .map_err(|e| format!("body is not a single GraphQL JSON request: {e}"))?;
    match &env.variables {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(m)) if m.is_empty() => {}
        Some(_) => return Err("GraphQL variables are not allowed".into()),
    }
    let tree = Parser::new(&env.query)
        .recursion_limit(RECURSION_LIMIT)
        .token_limit(TOKEN_LIMIT)
        .parse();
    if let Some(e) = tree.errors().next() {
        return Err(format!("GraphQL document does not parse: {}", e.message()));
    }
    let doc = tree.document();
    let mut defs = doc.definitions();
    let (Some(def), None) = (defs.next(), defs.next()) else {
        return Err("GraphQL document must hold exactly one operation".into());
    };
    let cst::Definition::OperationDefinition(op) = def else {
        return Err(
            "GraphQL document must be a query operation (no fragments or type definitions)".into(),
        );
    };
    if let Some(t) = op.operation_type()
        && t.query_token().is_none()
    {
        return Err("only a query is allowed (no mutation or subscription)".into());
    }
    if op.variable_definitions().is_some() || op.directives().is_some() {
        return Err("the query must not declare variables or directives".into());
    }
    let op_name = op.name().map(|n| n.text().to_string());
    match (&env.operation_name, &op_name) {
        (None, _) => {}
        (Some(asked), Some(actual)) if asked == actual => {}
        (Some(asked), _) => {
            return Err(format!(
                "operationName {asked:?} does not name the document's operation"
            ));
        }
    }
    let viewer = single_plain_field(op.selection_set(), "viewer")?;
    let login = single_plain_field(viewer.selection_set(), "login")?;
    if login.selection_set().is_some() {
        return Err("login must be a leaf field".into());
    }
    Ok(())
}

/// The one field of `set`, which must be `name` with no alias, arguments or directives.
fn single_plain_field(set: Option<cst::SelectionSet>, name: &str) -> Result<cst::Field, String> {
    let set = set.ok_or_else(|| format!("expected a selection of {name}"))?;
    let mut sels = set.selections();
    let (Some(sel), None) = (sels.next(), sels.next()) else {
        return Err(format!("the selection must be exactly `{name}`"));
    };
    let cst::Selection::Field(field) = sel else {
        return Err("fragments are not allowed".into());
    };
    if field.alias().is_some() {
        return Err(format!("`{name}` must not be aliased"));
    }
    if field.arguments().is_some() || field.directives().is_some() {
        return Err(format!("`{name}` must not take arguments or directives"));
    }
    match field.name() {
        Some(n) if n.text() == name => Ok(field),
        Some(n) => Err(format!(
            "field `{}` is not allowed (only `viewer {{ login }}`)",
            n.text()
        )),
        None => Err("unnamed field".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(query: &str) -> Vec<u8> {
        serde_json::json!({ "query": query })
            .to_string()
            .into_bytes()
    }

    #[test]
    fn allowed_documents() {
        let cases: &[(&str, &str)] = &[
            ("shorthand", "{ viewer { login } }"),
            ("query_keyword", "query { viewer { login } }"),
            ("named_query", "query Me { viewer { login } }"),
            ("whitespace_and_commas", "\n\tquery\t{viewer{login}},"),
            (
                "comments",
                "# who am I\nquery { # viewer\n viewer { login # just the login\n } }",
            ),
        ];
        for (name, q) in cases {
            assert_eq!(check_viewer_login(&body(q)), Ok(()), "{name}");
        }
        let named = serde_json::json!({"query": "query Me { viewer { login } }", "operationName": "Me", "variables": {}});
        assert_eq!(
            check_viewer_login(named.to_string().as_bytes()),
            Ok(()),
            "operation_name_matches"
        );
        let nulls = serde_json::json!({"query": "{ viewer { login } }", "operationName": null, "variables": null});
        assert_eq!(
            check_viewer_login(nulls.to_string().as_bytes()),
            Ok(()),
            "nulls"
        );
    }

    #[test]
    fn refused_documents() {
        let cases: &[(&str, &str)] = &[
            ("alias_of_viewer", "{ me: viewer { login } }"),
            ("alias_of_login", "{ viewer { name: login } }"),
            (
                "alias_selecting_more",
                "{ viewer { login } other: viewer { email } }",
            ),
            ("extra_field_in_viewer", "{ viewer { login email } }"),
            (
                "extra_top_level_field",
                "{ viewer { login } repository(owner:\"a\", name:\"b\") { id } }",
            ),
            ("arguments", "{ viewer(id: 1) { login } }"),
            ("directive", "{ viewer @include(if: true) { login } }"),
            ("inline_fragment", "{ viewer { ... on User { login } } }"),
            (
                "fragment_spread",
                "{ viewer { ...F } } fragment F on User { login }",
            ),
            ("mutation", "mutation { viewer { login } }"),
            ("subscription", "subscription { viewer { login } }"),
            (
                "two_operations",
                "query A { viewer { login } } query B { viewer { login } }",
            ),
            ("variables_declared", "query($x: Int) { viewer { login } }"),
            ("login_with_subselection", "{ viewer { login { x } } }"),
            (
                "other_field",
                "{ repository(owner: \"a\", name: \"b\") { id } }",
            ),
            ("syntax_error", "{ viewer { login }"),
            ("empty", ""),
            ("introspection", "{ __schema { types { name } } }"),
            ("typename", "{ viewer { login __typename } }"),
            (
                "deep_nesting",
                &format!("{}{}", "{ a ".repeat(200), "}".repeat(200)),
            ),
        ];
        for (name, q) in cases {
            assert!(
                check_viewer_login(&body(q)).is_err(),
                "{name} must be refused"
            );
        }
    }

    #[test]
    fn refused_envelopes() {
        let cases: &[(&str, &[u8])] = &[
            ("batched_array", br#"[{"query":"{ viewer { login } }"}]"#),
            ("not_json", b"query { viewer { login } }"),
            (
                "duplicate_query_key",
                br#"{"query":"{ viewer { login } }","query":"mutation { x }"}"#,
            ),
            (
                "extra_key",
                br#"{"query":"{ viewer { login } }","extensions":{}}"#,
            ),
            (
                "variables_given",
                br#"{"query":"{ viewer { login } }","variables":{"x":1}}"#,
            ),
            (
                "operation_name_mismatch",
                br#"{"query":"query A { viewer { login } }","operationName":"B"}"#,
            ),
            (
                "operation_name_for_anonymous",
                br#"{"query":"{ viewer { login } }","operationName":"A"}"#,
            ),
            ("query_not_string", br#"{"query":{"a":1}}"#),
            ("empty_body", b""),
            ("gzip_magic", &[0x1f, 0x8b, 8, 0, 0, 0]),
        ];
        for (name, b) in cases {
            assert!(check_viewer_login(b).is_err(), "{name} must be refused");
        }
        let big = format!(
            r#"{{"query":"{{ viewer {{ login }} }}","x":"{}"}}"#,
            "a".repeat(MAX_BODY_BYTES)
        );
        assert!(
            check_viewer_login(big.as_bytes()).is_err(),
            "oversized body"
        );
    }
}
