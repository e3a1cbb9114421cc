//! The validate step (pure): the CRD's cross-field rules (the same ones the API server runs as
//! CEL, in case the object slipped past an older schema) plus what only the operator knows —
//! which provisioning modes this deployment supports.

use ebbflow_crds::{FieldError, ProvisioningMode, TrainingJob};

/// What the operator can do, for validation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Capabilities {
    /// An EC2 provisioner is configured.
    pub ec2: bool,
}

/// Every problem with the job's spec, each naming its field; empty when valid.
pub fn validate(job: &TrainingJob, capabilities: Capabilities) -> Vec<FieldError> {
    let mut errors = match job.spec.validate() {
        Ok(()) => Vec::new(),
        Err(invalid) => invalid.0,
    };
    let spec = &job.spec;
    if spec.provisioning.mode == ProvisioningMode::Ec2 && !capabilities.ec2 {
        errors.push(FieldError {
            field: "spec.provisioning.mode".to_owned(),
            detail: "ec2 provisioning is not available in this operator build".to_owned(),
        });
    }
    if spec.bidding.decision_interval.to_duration().is_none() {
        errors.push(FieldError {
            field: "spec.bidding.decisionInterval".to_owned(),
            detail: format!(
                "unparsable duration {:?}",
                spec.bidding.decision_interval.as_str()
            ),
        });
    }
    errors
}

/// One message naming every failed field, as the condition and event carry it.
pub fn message(errors: &[FieldError]) -> String {
    let parts: Vec<String> = errors
        .iter()
        .map(|error| format!("{}: {}", error.field, error.detail))
        .collect();
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_fixture_passes() {
        assert!(
            validate(
                &TrainingJob::test("mf").with_transient(4),
                Capabilities::default()
            )
            .is_empty()
        );
    }

    #[test]
    fn rule_violations_name_their_field() {
        let job = TrainingJob::test("bad").with_transient_range(5, 2);
        let errors = validate(&job, Capabilities::default());
        assert_eq!(errors[0].field, "spec.transient.minNodes");
        assert!(message(&errors).starts_with("spec.transient.minNodes: "));
    }

    #[test]
    fn ec2_mode_needs_an_ec2_provisioner() {
        let job = TrainingJob::test("ec2").with_ec2_provisioning("us-east-1", "lt");
        let errors = validate(&job, Capabilities::default());
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.provisioning.mode");
        assert!(validate(&job, Capabilities { ec2: true }).is_empty());
    }
}
