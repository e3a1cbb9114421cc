//! Calibration files: what `ebbflow-elastic-bench --stages --calibration-out FILE` measured,
//! read and validated for the application model (format `ebbflow-calibration/1`, documented in
//! docs/bidder.md "Application terms and calibration").
//!
//! A file holds, for a fixed number of nodes at a per-node bandwidth, the seconds per iteration
//! of each AgileML stage at each transient:reliable split, including a reliable-only split (the
//! reference). [`Calibration::throughput_table`] turns it into the application model's
//! [`ThroughputTable`]: a split's throughput in its best stage over the reference's.

use std::path::Path;

use serde::Deserialize;

use super::app::ThroughputTable;

/// The format this reader accepts.
pub const FORMAT: &str = "ebbflow-calibration/1";

/// A calibration file that cannot be used: always names the file and, where it applies, the
/// field.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// The file could not be read.
    #[error("calibration {file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not JSON of the expected shape (serde's message names the line and column).
    #[error("calibration {file}: {source}")]
    Parse {
        /// The file.
        file: String,
        /// Why, with line and column.
        source: serde_json::Error,
    },
    /// A field holds a value the model cannot use.
    #[error("calibration {file}: {field}: {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// The field, as a JSON path (`ratios[2].stages[0].seconds_per_iteration`).
        field: String,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileStage {
    stage: u8,
    seconds_per_iteration: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRatio {
    reliable_nodes: u32,
    transient_nodes: u32,
    stages: Vec<FileStage>,
    best_stage: u8,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: String,
    app: String,
    nodes: u32,
    bandwidth_mbps_per_node: f64,
    clocks: u64,
    counted_from_clock: u64,
    backup_every: u64,
    ratios: Vec<FileRatio>,
}

/// One transient:reliable split as measured.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredRatio {
    /// Reliable nodes.
    pub reliable_nodes: u32,
    /// Transient nodes.
    pub transient_nodes: u32,
    /// (stage, seconds per iteration) for each stage run.
    pub stages: Vec<(u8, f64)>,
    /// The fastest stage.
    pub best_stage: u8,
    /// Its seconds per iteration.
    pub best_seconds: f64,
}

impl MeasuredRatio {
    /// Transient nodes per reliable node.
    pub fn ratio(&self) -> f64 {
        f64::from(self.transient_nodes) / f64::from(self.reliable_nodes)
    }
}

/// A validated calibration file.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// Where it was read from.
    pub source: String,
    /// The application benchmarked (`mf`: MF on MovieLens 100K).
    pub app: String,
    /// Nodes in every split.
    pub nodes: u32,
    /// Per-node bandwidth limit each way, Mbit/s.
    pub bandwidth_mbps_per_node: f64,
    /// Iterations per run.
    pub clocks: u64,
    /// The first counted iteration.
    pub counted_from_clock: u64,
    /// Clocks between BackupPS copies in stages 2 and 3.
    pub backup_every: u64,
    /// The splits, by ratio.
    pub ratios: Vec<MeasuredRatio>,
}

impl Calibration {
    /// Read and validate `path`.
    pub fn load(path: &Path) -> Result<Self, CalibrationError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CalibrationError::Read {
            file: file.clone(),
            source,
        })?;
        Self::parse(&text, &file)
    }

    /// Validate `text`, read from `file` (named in errors).
    pub fn parse(text: &str, file: &str) -> Result<Self, CalibrationError> {
        let raw: File = serde_json::from_str(text).map_err(|source| CalibrationError::Parse {
            file: file.to_owned(),
            source,
        })?;
        let invalid = |field: String, reason: String| CalibrationError::Invalid {
            file: file.to_owned(),
            field,
            reason,
        };
        if raw.format != FORMAT {
            return Err(invalid(
                "format".into(),
                format!("{:?} is not {FORMAT:?}", raw.format),
            ));
        }
        if raw.nodes == 0 {
            return Err(invalid("nodes".into(), "must be at least 1".into()));
        }
        if !(raw.bandwidth_mbps_per_node.is_finite() && raw.bandwidth_mbps_per_node > 0.0) {
            return Err(invalid(
                "bandwidth_mbps_per_node".into(),
                format!("{} is not a positive number", raw.bandwidth_mbps_per_node),
            ));
        }
        if raw.counted_from_clock >= raw.clocks {
            return Err(invalid(
                "counted_from_clock".into(),
                format!(
                    "{} leaves no counted iteration of {} clocks",
                    raw.counted_from_clock, raw.clocks
                ),
            ));
        }
        if raw.ratios.is_empty() {
            return Err(invalid("ratios".into(), "no split was measured".into()));
        }
        let mut ratios: Vec<MeasuredRatio> = Vec::with_capacity(raw.ratios.len());
        for (i, entry) in raw.ratios.iter().enumerate() {
            let at = |field: &str| format!("ratios[{i}].{field}");
            if entry.reliable_nodes == 0 {
                return Err(invalid(
                    at("reliable_nodes"),
                    "must be at least 1 (AgileML keeps a reliable node)".into(),
                ));
            }
            if entry.reliable_nodes + entry.transient_nodes != raw.nodes {
                return Err(invalid(
                    at("transient_nodes"),
                    format!(
                        "{} reliable + {} transient is not the file's {} nodes",
                        entry.reliable_nodes, entry.transient_nodes, raw.nodes
                    ),
                ));
            }
            if entry.stages.is_empty() {
                return Err(invalid(at("stages"), "no stage was measured".into()));
            }
            let mut stages: Vec<(u8, f64)> = Vec::with_capacity(entry.stages.len());
            for (j, stage) in entry.stages.iter().enumerate() {
                let field = |name: &str| at(&format!("stages[{j}].{name}"));
                let allowed = if entry.transient_nodes == 0 { 1 } else { 3 };
                if !(1..=allowed).contains(&stage.stage) {
                    return Err(invalid(
                        field("stage"),
                        format!(
                            "stage {} with {} transient nodes (stages are 1–{allowed})",
                            stage.stage, entry.transient_nodes
                        ),
                    ));
                }
                if stages.iter().any(|s| s.0 == stage.stage) {
                    return Err(invalid(
                        field("stage"),
                        format!("stage {} is listed twice", stage.stage),
                    ));
                }
                let seconds = stage.seconds_per_iteration;
                if !(seconds.is_finite() && seconds > 0.0) {
                    return Err(invalid(
                        field("seconds_per_iteration"),
                        format!("{seconds} is not a positive number of seconds"),
                    ));
                }
                stages.push((stage.stage, seconds));
            }
            let (fastest, best_seconds) = stages
                .iter()
                .copied()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap_or((0, f64::NAN));
            let listed = stages.iter().find(|s| s.0 == entry.best_stage);
            match listed {
                None => {
                    return Err(invalid(
                        at("best_stage"),
                        format!("stage {} was not measured", entry.best_stage),
                    ));
                }
                Some(&(_, seconds)) if seconds > best_seconds => {
                    return Err(invalid(
                        at("best_stage"),
                        format!(
                            "stage {} ({seconds} s) but stage {fastest} is faster ({best_seconds} s)",
                            entry.best_stage
                        ),
                    ));
                }
                Some(_) => {}
            }
            let measured = MeasuredRatio {
                reliable_nodes: entry.reliable_nodes,
                transient_nodes: entry.transient_nodes,
                stages,
                best_stage: entry.best_stage,
                best_seconds,
            };
            if let Some(k) = ratios.iter().position(|r| r.ratio() == measured.ratio()) {
                return Err(invalid(
                    at("transient_nodes"),
                    format!(
                        "the split {}:{} is also ratios[{k}]",
                        entry.transient_nodes, entry.reliable_nodes
                    ),
                ));
            }
            ratios.push(measured);
        }
        if !ratios.iter().any(|r| r.transient_nodes == 0) {
            return Err(invalid(
                "ratios".into(),
                "no reliable-only split (transient_nodes 0), which throughput is relative to"
                    .into(),
            ));
        }
        ratios.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
        Ok(Self {
            source: file.to_owned(),
            app: raw.app,
            nodes: raw.nodes,
            bandwidth_mbps_per_node: raw.bandwidth_mbps_per_node,
            clocks: raw.clocks,
            counted_from_clock: raw.counted_from_clock,
            backup_every: raw.backup_every,
            ratios,
        })
    }

    /// Each split's throughput in its best stage over the reliable-only split's.
    pub fn throughput_table(&self) -> ThroughputTable {
        let reference = self
            .ratios
            .iter()
            .find(|r| r.transient_nodes == 0)
            .map_or(f64::NAN, |r| r.best_seconds);
        let points = self
            .ratios
            .iter()
            .map(|r| (r.ratio(), reference / r.best_seconds))
            .collect();
        // validated above: one reliable-only split, distinct ratios, positive seconds
        ThroughputTable::new(points).expect("a validated calibration gives a valid table")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
      "format": "ebbflow-calibration/1", "app": "mf", "nodes": 8,
      "bandwidth_mbps_per_node": 100.0, "clocks": 40, "counted_from_clock": 2, "backup_every": 5,
      "ratios": [
        {"reliable_nodes": 8, "transient_nodes": 0, "best_stage": 1,
         "stages": [{"stage": 1, "seconds_per_iteration": 0.06}]},
        {"reliable_nodes": 4, "transient_nodes": 4, "best_stage": 1,
         "stages": [{"stage": 1, "seconds_per_iteration": 0.06},
                    {"stage": 2, "seconds_per_iteration": 0.12},
                    {"stage": 3, "seconds_per_iteration": 0.10}]},
        {"reliable_nodes": 1, "transient_nodes": 7, "best_stage": 2,
         "stages": [{"stage": 1, "seconds_per_iteration": 0.24},
                    {"stage": 2, "seconds_per_iteration": 0.08},
                    {"stage": 3, "seconds_per_iteration": 0.09}]}
      ]
    }"#;

    fn error(text: &str) -> String {
        Calibration::parse(text, "cal.json")
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn a_good_file_gives_the_best_stage_throughput_over_reliable_only() {
        let calibration = Calibration::parse(GOOD, "cal.json").expect("valid");
        assert_eq!(calibration.ratios.len(), 3);
        let table = calibration.throughput_table();
        let points = table.points();
        assert_eq!(points.len(), 3);
        assert_eq!(points[0], (0.0, 1.0));
        assert_eq!(points[1], (1.0, 1.0));
        // 7:1 in stage 2: 0.06 / 0.08
        assert!((points[2].0 - 7.0).abs() < 1e-12);
        assert!((points[2].1 - 0.75).abs() < 1e-12);
    }

    #[test]
    fn malformed_files_name_the_file_and_field() {
        let cases = [
            (
                GOOD.replace(
                    "\"seconds_per_iteration\": 0.12",
                    "\"seconds_per_iteration\": 0",
                ),
                "cal.json: ratios[1].stages[1].seconds_per_iteration: 0 is not a positive",
            ),
            (
                GOOD.replace(
                    "\"seconds_per_iteration\": 0.12",
                    "\"seconds_per_iteration\": -1",
                ),
                "ratios[1].stages[1].seconds_per_iteration: -1",
            ),
            (
                GOOD.replace("\"best_stage\": 2", "\"best_stage\": 3"),
                "cal.json: ratios[2].best_stage: stage 3 (0.09 s) but stage 2 is faster",
            ),
            (
                GOOD.replace(
                    "\"reliable_nodes\": 8, \"transient_nodes\": 0",
                    "\"reliable_nodes\": 8, \"transient_nodes\": 1",
                ),
                "cal.json: ratios[0].transient_nodes: 8 reliable + 1 transient is not the file's 8",
            ),
            (
                GOOD.replace(
                    "\"reliable_nodes\": 1, \"transient_nodes\": 7",
                    "\"reliable_nodes\": 0, \"transient_nodes\": 8",
                ),
                "cal.json: ratios[2].reliable_nodes: must be at least 1",
            ),
            (
                GOOD.replace("ebbflow-calibration/1", "ebbflow-calibration/9"),
                "cal.json: format:",
            ),
            (
                GOOD.replace(
                    "\"bandwidth_mbps_per_node\": 100.0",
                    "\"bandwidth_mbps_per_node\": 0.0",
                ),
                "cal.json: bandwidth_mbps_per_node: 0 is not a positive number",
            ),
            (
                GOOD.replace(
                    "{\"stage\": 3, \"seconds_per_iteration\": 0.10}",
                    "{\"stage\": 2, \"seconds_per_iteration\": 0.10}",
                ),
                "cal.json: ratios[1].stages[2].stage: stage 2 is listed twice",
            ),
            (
                GOOD.replace(
                    "[{\"stage\": 1, \"seconds_per_iteration\": 0.06}]",
                    "[{\"stage\": 2, \"seconds_per_iteration\": 0.06}]",
                ),
                "cal.json: ratios[0].stages[0].stage: stage 2 with 0 transient nodes",
            ),
        ];
        for (text, expected) in cases {
            let message = error(&text);
            assert!(message.contains(expected), "{message:?} lacks {expected:?}");
        }
    }

    #[test]
    fn missing_fields_and_bad_json_are_errors_not_zeros() {
        // no seconds at all: serde names the missing field, with its line and column
        let text = GOOD.replace(", \"seconds_per_iteration\": 0.12", "");
        let message = error(&text);
        assert!(
            message.starts_with("calibration cal.json: missing field `seconds_per_iteration`"),
            "{message}"
        );
        assert!(message.contains("line "), "{message}");
        // a string where a number belongs
        let message = error(&GOOD.replace("0.08", "\"0.08\""));
        assert!(
            message.contains("cal.json") && message.contains("line"),
            "{message}"
        );
        // a typo is not ignored
        let message = error(&GOOD.replace("\"backup_every\"", "\"backup_evry\""));
        assert!(message.contains("unknown field `backup_evry`"), "{message}");
        // no reliable-only reference
        let only_mixed = GOOD.replace(
            "{\"reliable_nodes\": 8, \"transient_nodes\": 0, \"best_stage\": 1,\n         \"stages\": [{\"stage\": 1, \"seconds_per_iteration\": 0.06}]},",
            "",
        );
        assert_ne!(only_mixed, GOOD);
        assert!(error(&only_mixed).contains("cal.json: ratios: no reliable-only split"));
        // a file that is not there
        let missing = Calibration::load(Path::new("/nonexistent/cal.json")).expect_err("missing");
        assert!(
            missing
                .to_string()
                .starts_with("calibration /nonexistent/cal.json:")
        );
    }

    #[test]
    fn the_committed_calibration_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../bench/calibration/mf-movielens100k-8nodes-100mbps.json");
        let calibration = Calibration::load(&path).expect("the committed file is valid");
        let table = calibration.throughput_table();
        assert_eq!(table.points()[0], (0.0, 1.0));
        assert!(table.points().len() >= 2);
    }
}
