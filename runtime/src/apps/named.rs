//! Apps by name with their standard data, so processes (node processes, benchmarks, examples)
//! build exactly the same app from a short argument: `mf`, `mlr` and `lda` on the real data sets
//! (MovieLens 100K, digits, reuters; seeded 80/20 splits), and `*-synthetic` variants that need
//! no download (the quickstart's).

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::data::{self, DataError};

use super::{AppsError, LdaApp, LdaConfig, MfApp, MfConfig, MlrApp, MlrConfig};

/// Every name [`build_named_app`] accepts.
pub const APP_NAMES: [&str; 6] = [
    "mf",
    "mlr",
    "lda",
    "mf-synthetic",
    "mlr-synthetic",
    "lda-synthetic",
];

/// Seed of the standard 80/20 train/test splits.
pub const SPLIT_SEED: u64 = 42;

/// Errors building a named app.
#[derive(Debug, Error)]
pub enum NamedAppError {
    /// The name is not one of [`APP_NAMES`].
    #[error("unknown app {name:?}: expected one of {}", APP_NAMES.join(", "))]
    Lookup {
        /// The name given.
        name: String,
    },
    /// A real-data app was asked for without a data directory.
    #[error("app {name:?} reads real data: set EBBFLOW_DATA_DIR (scripts/fetch-data.sh)")]
    LocateData {
        /// The app.
        name: String,
    },
    /// Loading the data failed.
    #[error(transparent)]
    Load(#[from] DataError),
    /// Building the app failed.
    #[error(transparent)]
    Build(#[from] AppsError),
}

impl NamedAppError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            NamedAppError::Lookup { .. } => "lookup",
            NamedAppError::LocateData { .. } => "locate_data",
            NamedAppError::Load(_) => "load",
            NamedAppError::Build(_) => "build",
        }
    }
}

/// One of the three apps, built by name.
#[derive(Debug, Clone)]
pub enum NamedApp {
    /// Matrix factorization.
    Mf(MfApp),
    /// Multinomial logistic regression.
    Mlr(MlrApp),
    /// LDA.
    Lda(LdaApp),
}

fn require(name: &str, data_dir: Option<&Path>, file: &str) -> Result<PathBuf, NamedAppError> {
    data_dir
        .map(|dir| dir.join(file))
        .ok_or_else(|| NamedAppError::LocateData { name: name.into() })
}

/// Builds the app called `name` for a job of SSP `staleness` (0 = BSP; it sizes MF's and LDA's
/// clocks); real-data apps read their file from `data_dir`.
pub fn build_named_app(
    name: &str,
    data_dir: Option<&Path>,
    staleness: u64,
) -> Result<NamedApp, NamedAppError> {
    Ok(match name {
        "mf" => {
            let path = require(name, data_dir, "ml-100k.inter")?;
            let (train, test) = data::load_movielens_inter(&path)?.split(0.2, SPLIT_SEED)?;
            let config = MfConfig {
                staleness,
                ..MfConfig::default()
            };
            NamedApp::Mf(MfApp::new(train, test, config)?)
        }
        "mlr" => {
            let path = require(name, data_dir, "digits.csv.gz")?;
            let mut digits = data::load_digits(&path)?;
            digits.scale(1.0 / 16.0);
            let (train, test) = digits.split(0.2, SPLIT_SEED)?;
            NamedApp::Mlr(MlrApp::new(train, test, MlrConfig::default())?)
        }
        "lda" => {
            let path = require(name, data_dir, "reuters.ldac")?;
            let config = LdaConfig {
                staleness,
                ..LdaConfig::default()
            };
            NamedApp::Lda(LdaApp::new(data::load_ldac(&path)?, config)?)
        }
        "mf-synthetic" => {
            let generated = data::synthetic_ratings(400, 200, 4, 12_000, 0.1, SPLIT_SEED)?;
            let (train, test) = generated.ratings.split(0.2, SPLIT_SEED)?;
            let config = MfConfig {
                rank: 4,
                learning_rate: 0.02,
                decay: 0.98,
                regularization: 0.02,
                staleness,
                ..MfConfig::default()
            };
            NamedApp::Mf(MfApp::new(train, test, config)?)
        }
        "mlr-synthetic" => {
            let generated = data::synthetic_classification(2000, 20, 5, 1.0, SPLIT_SEED)?;
            let (train, test) = generated.examples.split(0.2, SPLIT_SEED)?;
            let config = MlrConfig {
                learning_rate: 0.1,
                ..MlrConfig::default()
            };
            NamedApp::Mlr(MlrApp::new(train, test, config)?)
        }
        "lda-synthetic" => {
            let generated = data::synthetic_corpus(200, 500, 10, 80, 0.1, 0.05, SPLIT_SEED)?;
            let config = LdaConfig {
                num_topics: 10,
                staleness,
                ..LdaConfig::default()
            };
            NamedApp::Lda(LdaApp::new(generated.corpus, config)?)
        }
        other => {
            return Err(NamedAppError::Lookup { name: other.into() });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::App;
    use crate::apps::BareLoop;

    #[test]
    fn synthetic_apps_build_without_data_and_learn() {
        for name in ["mf-synthetic", "mlr-synthetic", "lda-synthetic"] {
            let (before, after) = match build_named_app(name, None, 0).unwrap() {
                NamedApp::Mf(app) => {
                    let mut bare = BareLoop::new(&app);
                    let before = app.evaluate(bare.tables()).loss;
                    (0..40).for_each(|_| {
                        bare.clock();
                    });
                    (before, app.evaluate(bare.tables()).loss)
                }
                NamedApp::Mlr(app) => {
                    let mut bare = BareLoop::new(&app);
                    let before = app.evaluate(bare.tables()).loss;
                    (0..10).for_each(|_| {
                        bare.clock();
                    });
                    (before, app.evaluate(bare.tables()).loss)
                }
                NamedApp::Lda(app) => {
                    let mut bare = BareLoop::new(&app);
                    bare.clock();
                    let before = app.evaluate(bare.tables()).loss;
                    (0..20).for_each(|_| {
                        bare.clock();
                    });
                    (before, app.evaluate(bare.tables()).loss)
                }
            };
            assert!(after < before, "{name}: loss {before} -> {after}");
        }
    }

    #[test]
    fn unknown_names_and_missing_data_are_clear_errors() {
        let error = build_named_app("svm", None, 0).unwrap_err();
        assert_eq!(error.category(), "lookup");
        assert!(error.to_string().contains("mf, mlr, lda"), "{error}");
        let error = build_named_app("mf", None, 0).unwrap_err();
        assert!(error.to_string().contains("EBBFLOW_DATA_DIR"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let error = build_named_app("lda", Some(dir.path()), 0).unwrap_err();
        assert_eq!(error.category(), "load");
        assert!(error.to_string().contains("reuters.ldac"), "{error}");
    }
}
