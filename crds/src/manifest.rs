//! Reading a `TrainingJob` manifest without a cluster (`ebbflow run`, tests), with the API
//! server's checks and messages: the generated OpenAPI schema (strict about unknown fields, as
//! `kubectl apply` is by default), then the cross-field [`RULES`](crate::RULES).

use std::sync::OnceLock;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use kube::Resource;
use serde_json::{Map, Value};

use crate::{
    TrainingJob,
    rules::{FieldError, join_errors},
};

/// Why a manifest was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The text is not YAML (or JSON) at all.
    #[error("parse manifest yaml: {0}")]
    Yaml(#[from] serde_yaml::Error),

    /// The document is a manifest but breaks the schema or a cross-field rule; every error
    /// names its field.
    #[error("TrainingJob.ebbflow.dev {name:?} is invalid: {}", join_errors(.errors))]
    Invalid {
        /// `metadata.name`, empty if missing.
        name: String,
        /// What is wrong, field by field.
        errors: Vec<FieldError>,
    },
}

impl ManifestError {
    /// The field errors (empty for a YAML syntax error).
    pub fn field_errors(&self) -> &[FieldError] {
        match self {
            Self::Yaml(_) => &[],
            Self::Invalid { errors, .. } => errors,
        }
    }
}

/// Parses and validates one `TrainingJob` YAML (or JSON) document, applying the schema's
/// defaults. Errors carry the messages the API server would give for the same document.
pub fn parse_manifest(yaml: &str) -> Result<TrainingJob, ManifestError> {
    let document: Value = serde_yaml::from_str(yaml)?;
    let name = document
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let invalid = |errors: Vec<FieldError>| ManifestError::Invalid {
        name: name.clone(),
        errors,
    };

    let mut errors = header_errors(&document);
    errors.extend(schema_errors(&document));
    if !errors.is_empty() {
        return Err(invalid(errors));
    }

    let job: TrainingJob = serde_json::from_value(document).map_err(|error| {
        // Unreachable for documents the schema admits; reported rather than panicking.
        invalid(vec![FieldError {
            field: "spec".to_owned(),
            detail: format!("Invalid value: {error}"),
        }])
    })?;
    job.spec.validate().map_err(|broken| invalid(broken.0))?;
    Ok(job)
}

/// apiVersion, kind and metadata.name, which the CRD schema leaves to the API server.
fn header_errors(document: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if !document.is_object() {
        errors.push(FieldError {
            field: "<root>".to_owned(),
            detail: format!(
                "Invalid value: {}: a TrainingJob manifest must be a mapping",
                render_value(document)
            ),
        });
        return errors;
    }
    let expected_api_version = TrainingJob::api_version(&());
    let expected_kind = TrainingJob::kind(&());
    for (field, expected) in [
        ("apiVersion", expected_api_version.as_ref()),
        ("kind", expected_kind.as_ref()),
    ] {
        match document.get(field) {
            None | Some(Value::Null) => errors.push(FieldError {
                field: field.to_owned(),
                detail: "Required value".to_owned(),
            }),
            Some(Value::String(found)) if found == expected => {}
            Some(found) => errors.push(FieldError {
                field: field.to_owned(),
                detail: format!(
                    "Unsupported value: {}: supported values: {expected:?}",
                    render_value(found)
                ),
            }),
        }
    }
    match document.pointer("/metadata/name") {
        None | Some(Value::Null) => errors.push(FieldError {
            field: "metadata.name".to_owned(),
            detail: "Required value: name is required".to_owned(),
        }),
        Some(Value::String(name)) if is_dns_subdomain(name) => {}
        Some(other) => errors.push(FieldError {
            field: "metadata.name".to_owned(),
            detail: format!(
                "Invalid value: {}: a lowercase RFC 1123 subdomain must consist of lower case \
                 alphanumeric characters, '-' or '.', and must start and end with an \
                 alphanumeric character",
                render_value(other)
            ),
        }),
    }
    errors
}

fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 253
        && bytes.iter().all(|&b| alnum(b) || b == b'-' || b == b'.')
        && bytes.first().copied().is_some_and(alnum)
        && bytes.last().copied().is_some_and(alnum)
}

/// The generated openAPIV3Schema, adjusted to JSON-schema semantics: `nullable` becomes a
/// `null` type, and objects with declared properties reject unknown fields (what
/// `kubectl apply`'s default strict field validation does).
pub(crate) fn manifest_json_schema() -> Value {
    let crd = crate::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|validation| validation.open_api_v3_schema.as_ref())
        .expect("derived CRD has an openAPIV3Schema");
    let mut schema = serde_json::to_value(schema).expect("schema serializes to JSON");
    // The CRD schema leaves the object's header to the API server; declare it so the root, too,
    // rejects unknown fields. header_errors checks the values.
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        properties.insert(
            "apiVersion".to_owned(),
            serde_json::json!({ "type": "string" }),
        );
        properties.insert("kind".to_owned(), serde_json::json!({ "type": "string" }));
        properties.insert(
            "metadata".to_owned(),
            serde_json::json!({ "type": "object" }),
        );
    }
    make_strict(&mut schema);
    schema
}

fn make_strict(node: &mut Value) {
    let Some(map) = node.as_object_mut() else {
        return;
    };
    if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        && !map.contains_key("type")
        && !map.contains_key("anyOf")
    {
        map.insert("type".to_owned(), serde_json::json!(["integer", "string"]));
    }
    if map.remove("nullable") == Some(Value::Bool(true)) {
        allow_null(map);
    }
    let preserves_unknown =
        map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if map.get("type") == Some(&Value::from("object"))
        && map.contains_key("properties")
        && !map.contains_key("additionalProperties")
        && !preserves_unknown
    {
        map.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    for (keyword, child) in map.iter_mut() {
        match keyword.as_str() {
            "properties" => child
                .as_object_mut()
                .into_iter()
                .flat_map(|properties| properties.values_mut())
                .for_each(make_strict),
            "items" | "additionalProperties" | "not" => make_strict(child),
            "allOf" | "anyOf" | "oneOf" => child
                .as_array_mut()
                .into_iter()
                .flatten()
                .for_each(make_strict),
            _ => {}
        }
    }
}

fn allow_null(map: &mut Map<String, Value>) {
    match map.get_mut("type") {
        Some(Value::String(kind)) => {
            let kind = std::mem::take(kind);
            map.insert("type".to_owned(), serde_json::json!([kind, "null"]));
        }
        Some(Value::Array(kinds)) => kinds.push(Value::from("null")),
        _ => {}
    }
    if let Some(Value::Array(values)) = map.get_mut("enum") {
        values.push(Value::Null);
    }
}

fn schema_validator() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft4)
            .should_validate_formats(true)
            .build(&manifest_json_schema())
            .expect("generated CRD schema compiles")
    })
}

/// Schema violations as API-server-style field errors.
fn schema_errors(document: &Value) -> Vec<FieldError> {
    let mut errors: Vec<FieldError> = schema_validator()
        .iter_errors(document)
        .flat_map(|error| field_errors_for(&error))
        .collect();
    errors.dedup();
    errors
}

fn field_errors_for(error: &jsonschema::ValidationError<'_>) -> Vec<FieldError> {
    let field = dotted_path(error.instance_path().as_str());
    let value = error.instance();
    let at = |detail: String| {
        vec![FieldError {
            field: field.clone(),
            detail,
        }]
    };
    match error.kind() {
        ValidationErrorKind::Required { property } => {
            let property = property.as_str().unwrap_or_default();
            vec![FieldError {
                field: join_path(&field, property),
                detail: "Required value".to_owned(),
            }]
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => unexpected
            .iter()
            .map(|property| FieldError {
                field: join_path(&field, property),
                detail: "Unknown field: field not declared in schema".to_owned(),
            })
            .collect(),
        ValidationErrorKind::Enum { options } => {
            let supported: Vec<String> = options
                .as_array()
                .into_iter()
                .flatten()
                .filter(|option| !option.is_null())
                .map(render_value)
                .collect();
            at(format!(
                "Unsupported value: {}: supported values: {}",
                render_value(value),
                supported.join(", ")
            ))
        }
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(types) => types
                    .into_iter()
                    .map(|t| t.to_string())
                    .filter(|t| t != "null")
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            let found = json_type_name(value);
            at(format!(
                "Invalid value: \"{found}\": {field} in body must be of type {expected}: \"{found}\""
            ))
        }
        ValidationErrorKind::Maximum { limit } => at(format!(
            "Invalid value: {}: {field} in body should be less than or equal to {}",
            render_value(value),
            render_number(limit)
        )),
        ValidationErrorKind::Minimum { limit } => at(format!(
            "Invalid value: {}: {field} in body should be greater than or equal to {}",
            render_value(value),
            render_number(limit)
        )),
        ValidationErrorKind::MaxLength { limit } => {
            at(format!("Too long: may not be more than {limit} bytes"))
        }
        ValidationErrorKind::MinLength { limit } => at(format!(
            "Invalid value: {}: {field} in body should be at least {limit} chars long",
            render_value(value)
        )),
        ValidationErrorKind::Pattern { pattern } => at(format!(
            "Invalid value: {}: {field} in body should match '{pattern}'",
            render_value(value)
        )),
        ValidationErrorKind::MaxItems { limit } => at(format!(
            "Too many: {}: must have at most {limit} items",
            value.as_array().map_or(0, Vec::len)
        )),
        ValidationErrorKind::Format { format } => at(format!(
            "Invalid value: {}: {field} in body must be of type {format}: {}",
            render_value(value),
            render_value(value)
        )),
        _ => at(format!("Invalid value: {}: {error}", render_value(value))),
    }
}

/// `/spec/reliable/tolerations/0/effect` → `spec.reliable.tolerations[0].effect`; map keys
/// that are not plain identifiers are bracketed (`nodeSelector[karpenter.sh/capacity-type]`).
fn dotted_path(pointer: &str) -> String {
    pointer
        .split('/')
        .skip(1)
        .map(|segment| segment.replace("~1", "/").replace("~0", "~"))
        .fold(String::new(), |path, segment| join_path(&path, &segment))
}

fn join_path(path: &str, segment: &str) -> String {
    let is_index = !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit());
    let is_identifier = segment
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if is_index || (!is_identifier && !path.is_empty()) {
        format!("{path}[{segment}]")
    } else if path.is_empty() {
        segment.to_owned()
    } else {
        format!("{path}.{segment}")
    }
}

/// A value as the API server prints it in `Invalid value: ...`.
fn render_value(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{text:?}"),
        Value::Object(_) | Value::Array(_) => format!("\"{}\"", json_type_name(value)),
        other => other.to_string(),
    }
}

/// A bound as Go's `%v` prints a float64: `1000`, not `1000.0`.
fn render_number(number: &Value) -> String {
    match number.as_f64() {
        Some(float) if float.fract() == 0.0 && float.abs() < 1e15 => format!("{}", float as i64),
        _ => number.to_string(),
    }
}

fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_pointers_become_dotted_paths() {
        assert_eq!(dotted_path(""), "");
        assert_eq!(
            dotted_path("/spec/transient/maxNodes"),
            "spec.transient.maxNodes"
        );
        assert_eq!(
            dotted_path("/spec/reliable/tolerations/0/effect"),
            "spec.reliable.tolerations[0].effect"
        );
        assert_eq!(
            dotted_path("/spec/reliable/nodeSelector/karpenter.sh~1capacity-type"),
            "spec.reliable.nodeSelector[karpenter.sh/capacity-type]"
        );
    }

    #[test]
    fn dns_subdomain_names() {
        for good in ["quickstart", "mf-1", "a.b-c", "0"] {
            assert!(is_dns_subdomain(good), "{good}");
        }
        for bad in ["", "Quickstart", "-a", "a-", "a_b", &"a".repeat(254)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }
}
