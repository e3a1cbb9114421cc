//! LDA's per-token log-likelihood after SWEEPS sweeps of reuters in one process, for a worker
//! count, clocks a sweep, staleness and seed given on the command line: separates what more
//! workers change from what slicing a sweep or stale reads change (issue 39).
//!
//!     cargo run --release -p ebbflow-runtime --example lda_workers -- WORKERS CLOCKS_A_SWEEP STALENESS SEED SWEEPS

use ebbflow_runtime::app::App;
use ebbflow_runtime::apps::{LdaApp, LdaConfig};
use ebbflow_runtime::local::run_single_process;
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()
        .map_err(|_| "usage: lda_workers WORKERS CLOCKS_A_SWEEP STALENESS SEED SWEEPS")?;
    let [workers, per_sweep, staleness, seed, sweeps] = args[..] else {
        return Err("usage: lda_workers WORKERS CLOCKS_A_SWEEP STALENESS SEED SWEEPS".into());
    };
    let dir = ebbflow_runtime::data::data_dir().ok_or("EBBFLOW_DATA_DIR is unset")?;
    let corpus = ebbflow_runtime::data::load_ldac(&dir.join("reuters.ldac"))?;
    let app = LdaApp::new(
        corpus,
        LdaConfig {
            seed,
            clocks_per_pass: Some(per_sweep as usize),
            ..LdaConfig::default()
        },
    )?;
    let config = JobConfig {
        clocks: sweeps * per_sweep,
        staleness,
        workers: workers as usize,
        partitions: 8,
        // EBBFLOW_PROCESS_CACHE=0: every thread its own cache and server identity.
        process_cache: std::env::var("EBBFLOW_PROCESS_CACHE").map_or(true, |v| v != "0"),
        ..JobConfig::default()
    };
    let report = run_single_process(&app, &config, &RuntimeMetrics::unregistered())?;
    let per_token = report
        .eval
        .metric("per_token_log_likelihood")
        .ok_or("no per-token log-likelihood")?;
    println!(
        "workers {workers} clocks/sweep {per_sweep} staleness {staleness} seed {seed} sweeps {sweeps}: {per_token:.4} ({} clocks per pass by the app)",
        app.clocks_per_pass(workers as usize)
    );
    Ok(())
}
