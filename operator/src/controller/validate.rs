//! The validate step (pure): the CRD's cross-field rules (the same ones the API server runs as
//! CEL, in case the object slipped past an older schema) plus what only the operator knows —
//! which provisioning modes this deployment supports.

use ebbflow_crds::{FieldError, ProvisioningMode, TrainingJob};

/// Longest job name whose children's names stay valid (`<name>-coordinator` ≤ 63).
pub const MAX_NAME_LENGTH: usize = 63 - "-coordinator".len();

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
    if let Some(name) = job.metadata.name.as_deref() {
        if name.len() > MAX_NAME_LENGTH {
            errors.push(FieldError {
                field: "metadata.name".to_owned(),
                detail: format!(
                    "must be at most {MAX_NAME_LENGTH} characters: the coordinator Service is named <name>-coordinator and Service names are at most 63"
                ),
            });
        }
        if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            errors.push(FieldError {
                field: "metadata.name".to_owned(),
                detail: "must start with a lowercase letter: it names the coordinator Service (DNS-1035)".to_owned(),
            });
        }
    }
    let spec = &job.spec;
    if spec.provisioning.mode == ProvisioningMode::Ec2 && !capabilities.ec2 {
        errors.push(FieldError {
            field: "spec.provisioning.mode".to_owned(),
            detail: "ec2 provisioning is not enabled in this operator (start it with --ec2-region)"
                .to_owned(),
        });
    }
    if spec.provisioning.mode == ProvisioningMode::Ec2 {
        // The operator launches instances itself: it must know which types.
        if spec.reliable.count > 0 && spec.reliable.instance_types.is_empty() {
            errors.push(FieldError {
                field: "spec.reliable.instanceTypes".to_owned(),
                detail: "required in ec2 provisioning mode (the type of the on-demand instances to launch)".to_owned(),
            });
        }
        if spec.transient.max_nodes > 0 && spec.transient.instance_types.is_empty() {
            errors.push(FieldError {
                field: "spec.transient.instanceTypes".to_owned(),
                detail: "required in ec2 provisioning mode (the spot instance types to launch)"
                    .to_owned(),
            });
        }
    }
    if let Err(detail) = ebbflow_job::jobmarket::throughput_table(job) {
        errors.push(FieldError {
            field: "spec.bidding.overrides.throughput".to_owned(),
            detail,
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
    fn a_throughput_table_needs_a_reliable_only_point_and_distinct_ratios() {
        use ebbflow_crds::{ApplicationTerms, ThroughputPoint};
        let with = |points: &[(f64, f64)]| {
            let mut job = TrainingJob::test("mf").with_transient(4);
            job.spec.bidding.overrides = Some(ApplicationTerms {
                throughput: Some(
                    points
                        .iter()
                        .map(|&(ratio, relative)| ThroughputPoint { ratio, relative })
                        .collect(),
                ),
                ..ApplicationTerms::default()
            });
            job
        };
        let good = with(&[(0.0, 1.0), (1.0, 1.017), (7.0, 0.958)]);
        assert!(validate(&good, Capabilities::default()).is_empty());
        let table = ebbflow_job::jobmarket::bidder_config(&good)
            .throughput
            .unwrap();
        assert_eq!(table.points().len(), 3);
        for bad in [
            with(&[(1.0, 1.0), (7.0, 0.958)]),
            with(&[(0.0, 1.0), (3.0, 0.5), (3.0, 0.6)]),
        ] {
            let errors = validate(&bad, Capabilities::default());
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_eq!(errors[0].field, "spec.bidding.overrides.throughput");
            assert!(
                ebbflow_job::jobmarket::bidder_config(&bad)
                    .throughput
                    .is_none()
            );
        }
    }

    #[test]
    fn rule_violations_name_their_field() {
        let job = TrainingJob::test("bad").with_transient_range(5, 2);
        let errors = validate(&job, Capabilities::default());
        assert_eq!(errors[0].field, "spec.transient.minNodes");
        assert!(message(&errors).starts_with("spec.transient.minNodes: "));
    }

    #[test]
    fn names_must_fit_the_children() {
        let long = TrainingJob::test(&"a".repeat(MAX_NAME_LENGTH + 1));
        let errors = validate(&long, Capabilities::default());
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "metadata.name");
        assert!(
            validate(
                &TrainingJob::test(&"a".repeat(MAX_NAME_LENGTH)),
                Capabilities::default()
            )
            .is_empty()
        );
        let digit = TrainingJob::test("1job");
        assert_eq!(
            validate(&digit, Capabilities::default())[0].field,
            "metadata.name"
        );
    }

    #[test]
    fn ec2_mode_needs_an_ec2_provisioner() {
        let mut job = TrainingJob::test("ec2")
            .with_ec2_provisioning("us-east-1", "lt")
            .with_transient(2);
        job.spec.reliable.instance_types = vec!["m5.large".into()];
        job.spec.transient.instance_types = vec!["c5.xlarge".into()];
        let errors = validate(&job, Capabilities::default());
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.provisioning.mode");
        assert!(validate(&job, Capabilities { ec2: true }).is_empty());

        // the operator launches instances itself: it must know their types
        job.spec.reliable.instance_types.clear();
        job.spec.transient.instance_types.clear();
        let fields: Vec<String> = validate(&job, Capabilities { ec2: true })
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "spec.reliable.instanceTypes",
                "spec.transient.instanceTypes"
            ]
        );
    }
}
