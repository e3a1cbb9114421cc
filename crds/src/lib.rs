//! The `TrainingJob` API (`ebbflow.dev/v1alpha1`) and CRD YAML generation.

/// Errors from generating the CRD document.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The CRD could not be serialized to YAML.
    #[error("serialize crd to yaml: {0}")]
    Serialize(#[from] serde_yaml::Error),
}

/// The TrainingJob CRD as a YAML document (what `ebbflow crd` prints).
pub fn crd_yaml() -> Result<String, CrdError> {
    Ok(String::new())
}
