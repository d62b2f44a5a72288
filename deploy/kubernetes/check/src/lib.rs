//! Checks of the Kubernetes artifacts under `deploy/kubernetes/`, as an API server would take
//! them, but stricter: it refuses a field it does not know where the server would drop it.
//!
//! - Kubernetes' own kinds (`Namespace`, `RuntimeClass`, `DaemonSet`) are read into the API
//!   types of `k8s-openapi` and written back; a field of the manifest missing from what is
//!   written back is one the types do not have (they skip unknown fields on reading).
//! - agent-sandbox's kinds (`SandboxTemplate`, `SandboxWarmPool`, `SandboxClaim`) are checked
//!   against the published CRDs' schemas (a copy under `tests/data/agent-sandbox/`), made
//!   strict as a structural schema is: an object that lists its properties takes no others.
//!   Their metadata and pod template are read into the API types as above.
//! - A pod template with `runtimeClassName: svc` has its `svc.dev/*` annotations decided by
//!   `svc_control::policy::pod`, as the shim and svcd decide them.
//! - containerd's configuration snippets register the runtime the RuntimeClass names.

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::{
    api::{
        apps::v1::DaemonSet, core::v1::Namespace, core::v1::PodTemplateSpec, node::v1::RuntimeClass,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

/// The RuntimeClass handler and containerd runtime name svc registers.
pub const HANDLER: &str = "svc";
/// The containerd runtime type of svc's shim.
pub const RUNTIME_TYPE: &str = "io.containerd.svc.v1";

/// The CRDs' schemas, strict, by `apiVersion` and `kind`.
pub struct Crds {
    validators: BTreeMap<(String, String), jsonschema::Validator>,
}

impl Crds {
    /// Every served version of every CRD file (`*.yaml`) in `dir`.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let mut validators = BTreeMap::new();
        for path in yaml_files(dir)? {
            let crd = read_yaml(&path)?;
            let group = crd["spec"]["group"].as_str().unwrap_or_default();
            let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or_default();
            let versions = crd["spec"]["versions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for v in versions.iter().filter(|v| v["served"] == true) {
                let name = v["name"].as_str().unwrap_or_default();
                let mut schema = v["schema"]["openAPIV3Schema"].clone();
                structural(&mut schema);
                let validator = jsonschema::validator_for(&schema)
                    .map_err(|e| format!("{}: version {name}: {e}", path.display()))?;
                validators.insert((format!("{group}/{name}"), kind.to_owned()), validator);
            }
        }
        if validators.is_empty() {
            return Err(format!("no CRD versions found in {}", dir.display()));
        }
        Ok(Crds { validators })
    }

    /// The kinds loaded, as `apiVersion kind`.
    pub fn kinds(&self) -> Vec<String> {
        self.validators
            .keys()
            .map(|(v, k)| format!("{v} {k}"))
            .collect()
    }
}

/// What [`check`] found a document to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// `apiVersion kind name`.
    pub what: String,
    /// Pod templates it holds that run on svc (`runtimeClassName: svc`).
    pub svc_pods: usize,
}

/// Check one manifest document.
pub fn check(doc: &Value, crds: &Crds) -> Result<Checked, String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let what = format!("{api_version} {kind} {name}");
    let mut pods = Vec::new();
    match (api_version, kind) {
        ("v1", "Namespace") => {
            strict::<Namespace>(doc)?;
        }
        ("node.k8s.io/v1", "RuntimeClass") => {
            let rc = strict::<RuntimeClass>(doc)?;
            if rc.handler != HANDLER {
                return Err(format!(
                    "RuntimeClass handler {:?}, expected {HANDLER:?}",
                    rc.handler
                ));
            }
        }
        ("apps/v1", "DaemonSet") => {
            let ds = strict::<DaemonSet>(doc)?;
            pods.extend(ds.spec.map(|s| s.template));
        }
        _ => {
            let validator = crds
                .validators
                .get(&(api_version.to_owned(), kind.to_owned()))
                .ok_or_else(|| {
                    format!(
                        "{what}: no API type or CRD for this kind (known CRDs: {})",
                        crds.kinds().join(", ")
                    )
                })?;
            let errors: Vec<String> = validator
                .iter_errors(doc)
                .map(|e| format!("{} at {}", e, e.instance_path()))
                .collect();
            if !errors.is_empty() {
                return Err(format!(
                    "does not fit the CRD's schema: {}",
                    errors.join("; ")
                ));
            }
            strict::<ObjectMeta>(&doc["metadata"]).map_err(|e| format!("metadata: {e}"))?;
            if let Some(t) = doc["spec"].get("podTemplate") {
                pods.push(
                    strict::<PodTemplateSpec>(t).map_err(|e| format!("spec.podTemplate: {e}"))?,
                );
            }
            if let Some(extra) = doc["spec"]["additionalPodMetadata"]["annotations"].as_object() {
                let extra = extra
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                svc_policy(&extra).map_err(|e| format!("spec.additionalPodMetadata: {e}"))?;
            }
        }
    }
    let mut svc_pods = 0;
    for pod in &pods {
        let on_svc = pod
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref())
            == Some(HANDLER);
        if on_svc {
            svc_pods += 1;
            let annotations = pod
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone())
                .unwrap_or_default();
            svc_policy(&annotations).map_err(|e| format!("pod template: {e}"))?;
        }
    }
    Ok(Checked { what, svc_pods })
}

/// A pod's annotations as svc reads them: the request they make, checked by the creation
/// rules (with the built-in host defaults).
pub fn svc_policy(annotations: &BTreeMap<String, String>) -> Result<(), String> {
    use svc_control::{api::SandboxName, config::host::HostConfig, policy::pod};
    let name = SandboxName::new("manifest").map_err(|e| e.to_string())?;
    let req = pod::request_from_annotations(name, annotations).map_err(|e| e.to_string())?;
    pod::check(&HostConfig::default(), &req).map_err(|e| e.to_string())
}

/// A containerd configuration snippet: `version` and the CRI plugin's `runtimes.svc` table,
/// which must name svc's runtime type and pass the pods' `svc.dev/*` annotations on.
pub fn check_containerd(text: &str) -> Result<(), String> {
    let config: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let version = config.get("version").and_then(toml::Value::as_integer);
    let plugin = match version {
        Some(2) => "io.containerd.grpc.v1.cri",
        Some(3) => "io.containerd.cri.v1.runtime",
        other => {
            return Err(format!(
                "version {other:?}: expected 2 (containerd 1.x) or 3 (2.x)"
            ));
        }
    };
    let runtime = config
        .get("plugins")
        .and_then(|p| p.get(plugin))
        .and_then(|p| p.get("containerd"))
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.get(HANDLER))
        .and_then(toml::Value::as_table)
        .ok_or_else(|| format!("no [plugins.\"{plugin}\".containerd.runtimes.{HANDLER}] table"))?;
    let known = ["runtime_type", "pod_annotations", "container_annotations"];
    if let Some(k) = runtime.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("runtimes.{HANDLER}: unexpected key {k}"));
    }
    if runtime.get("runtime_type").and_then(toml::Value::as_str) != Some(RUNTIME_TYPE) {
        return Err(format!(
            "runtimes.{HANDLER}.runtime_type must be {RUNTIME_TYPE:?}"
        ));
    }
    let passes = runtime
        .get("pod_annotations")
        .and_then(toml::Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("svc.dev/*")));
    if !passes {
        return Err(format!(
            "runtimes.{HANDLER}.pod_annotations must pass \"svc.dev/*\" to the shim"
        ));
    }
    Ok(())
}

/// Read `doc` into `T` and write it back: a field of `doc` missing from what comes back is one
/// `T` does not have.
pub fn strict<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    match dropped(doc, &back, "") {
        Some(problem) => Err(problem),
        None => Ok(typed),
    }
}

/// The first place where `back` lost or changed what `orig` said.
fn dropped(orig: &Value, back: &Value, at: &str) -> Option<String> {
    match (orig, back) {
        (Value::Object(o), Value::Object(b)) => o.iter().find_map(|(k, v)| {
            let here = format!("{at}.{k}");
            match b.get(k) {
                Some(w) => dropped(v, w, &here),
                None => Some(format!("unknown field {here}")),
            }
        }),
        (Value::Array(o), Value::Array(b)) if o.len() == b.len() => o
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (v, w))| dropped(v, w, &format!("{at}[{i}]"))),
        (o, b) if o == b => None,
        (o, b) => Some(format!("{at}: {o} reads back as {b}")),
    }
}

/// Make a CRD's OpenAPI schema strict as the API server's pruning is: an object schema that
/// lists its properties (and does not keep unknown fields) takes no other; `nullable` admits
/// null.
pub fn structural(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    let keeps_unknown = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if obj.contains_key("properties") && !obj.contains_key("additionalProperties") && !keeps_unknown
    {
        obj.insert("additionalProperties".into(), Value::Bool(false));
    }
    if obj.get("nullable") == Some(&Value::Bool(true))
        && let Some(Value::String(t)) = obj.get("type").cloned()
    {
        obj.insert("type".into(), serde_json::json!([t, "null"]));
    }
    for (key, value) in obj.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" => {
                if let Some(props) = value.as_object_mut() {
                    props.values_mut().for_each(structural);
                }
            }
            "items" | "additionalProperties" | "not" => structural(value),
            "allOf" | "anyOf" | "oneOf" => {
                if let Some(list) = value.as_array_mut() {
                    list.iter_mut().for_each(structural);
                }
            }
            _ => {}
        }
    }
}

/// A YAML file's one document, as JSON.
pub fn read_yaml(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every `*.yaml` under `dir`, recursively, sorted.
pub fn yaml_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    files_ending(dir, ".yaml")
}

/// Every file under `dir` whose name ends with `suffix`, recursively, sorted.
pub fn files_ending(dir: &Path, suffix: &str) -> Result<Vec<std::path::PathBuf>, String> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.is_dir() {
            out.extend(files_ending(&path, suffix)?);
        } else if path.to_string_lossy().ends_with(suffix) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}
