//! The committed CRD YAML is what the types generate.

use std::path::PathBuf;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crds/ has a parent")
        .to_path_buf()
}

#[test]
fn committed_crd_yaml_matches_the_types() {
    let generated = ebbflow_crds::crd_yaml().expect("crd serializes");
    let path = repo_root().join(ebbflow_crds::CRD_YAML_PATH);
    if std::env::var_os("EBBFLOW_UPDATE_CRD").is_some() {
        std::fs::write(&path, &generated).expect("write crd yaml");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the TrainingJob types; regenerate it with:\n  {}",
        ebbflow_crds::CRD_YAML_PATH,
        ebbflow_crds::REGENERATE_COMMAND
    );
}

/// Walks every schema node below `node`, calling `visit(path, node)`.
fn walk(path: &str, node: &serde_json::Value, visit: &mut dyn FnMut(&str, &serde_json::Value)) {
    visit(path, node);
    if let Some(properties) = node.get("properties").and_then(|p| p.as_object()) {
        for (name, child) in properties {
            walk(&format!("{path}.{name}"), child, visit);
        }
    }
    if let Some(items) = node.get("items") {
        walk(&format!("{path}[]"), items, visit);
    }
    if let Some(values) = node.get("additionalProperties").filter(|v| v.is_object()) {
        walk(&format!("{path}{{}}"), values, visit);
    }
}

fn generated_schema() -> serde_json::Value {
    let crd = serde_json::to_value(ebbflow_crds::crd()).expect("crd serializes");
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
        .expect("CRD has an openAPIV3Schema")
        .clone()
}

#[test]
fn every_field_is_documented_for_kubectl_explain() {
    let mut undocumented = Vec::new();
    walk("", &generated_schema(), &mut |path, node| {
        let documented = node
            .get("description")
            .and_then(|d| d.as_str())
            .is_some_and(|d| !d.trim().is_empty());
        // List items and map values are documented by their field.
        if !documented && !path.ends_with("[]") && !path.ends_with("{}") {
            undocumented.push(path.to_owned());
        }
    });
    assert!(
        undocumented.is_empty(),
        "fields without a description: {undocumented:?}"
    );
}

#[test]
fn schema_is_structural() {
    // Kubernetes requires a type on every node (or int-or-string / preserve-unknown-fields) and
    // no $ref; kube's derive rewrites enums, we check nothing slipped through.
    let mut problems = Vec::new();
    walk("", &generated_schema(), &mut |path, node| {
        let int_or_string = node.get("x-kubernetes-int-or-string").is_some();
        if node.get("type").is_none() && !int_or_string {
            problems.push(format!("{path}: no type"));
        }
        for keyword in ["$ref", "oneOf", "allOf", "not", "definitions", "$defs"] {
            if node.get(keyword).is_some() {
                problems.push(format!("{path}: uses {keyword}"));
            }
        }
    });
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn crd_names_and_columns() {
    let crd = ebbflow_crds::crd();
    assert_eq!(crd.spec.group, "ebbflow.dev");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["tj".to_owned()]));
    assert_eq!(crd.spec.names.categories, Some(vec!["ebbflow".to_owned()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(
        version
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some())
    );
    let columns: Vec<&str> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Phase",
            "Stage",
            "Iteration",
            "Loss",
            "Nodes",
            "Cost",
            "Age"
        ]
    );
}
