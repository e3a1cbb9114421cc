//! A real Prometheus for the suites (Debian's package, `scripts/setup-prometheus.sh`; the
//! binary's path in `EBBFLOW_PROMETHEUS`) and the check that every Grafana dashboard expression
//! parses and, where its metrics have samples, returns data.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cluster::{BoxError, free_port, poll_until, repo_root};

/// Environment variable holding the Prometheus binary's path.
pub const PROMETHEUS_ENV: &str = "EBBFLOW_PROMETHEUS";

/// A Prometheus process on 127.0.0.1 (port 0's pick), killed on drop.
pub struct Prometheus {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts `binary` with `config` (a prometheus.yml) in `dir`: its config, data and log
    /// (`prometheus.log`) live there.
    pub fn start(binary: &std::ffi::OsStr, dir: &Path, config: &str) -> Result<Self, BoxError> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let port = free_port()?;
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        Ok(Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: ebbflow_runtime::admin::client(None)
                .timeout(Duration::from_secs(5))
                .build()?,
        })
    }

    /// The query API's answer to `expr`, evaluated now or at `at` (Unix seconds); an error
    /// unless it succeeded.
    pub async fn query(&self, expr: &str, at: Option<f64>) -> Result<serde_json::Value, BoxError> {
        let time = at.map(|t| format!("&time={t:.3}")).unwrap_or_default();
        let response = self
            .http
            .get(format!(
                "{}/api/v1/query?query={}{time}",
                self.base,
                percent_encode(expr)
            ))
            .send()
            .await?;
        let status = response.status();
        let body: serde_json::Value = response.json().await?;
        if !status.is_success() || body["status"] != "success" {
            return Err(format!("query {expr:?} failed ({status}): {body}").into());
        }
        Ok(body)
    }

    /// How many series `expr` returns (0 while Prometheus is not answering yet).
    pub async fn count(&self, expr: &str, at: Option<f64>) -> usize {
        self.query(expr, at)
            .await
            .ok()
            .and_then(|body| body["data"]["result"].as_array().map(Vec::len))
            .unwrap_or(0)
    }

    /// Waits until `expr` returns at least `series` series.
    pub async fn wait_for(
        &self,
        what: &str,
        expr: &str,
        series: usize,
        timeout: Duration,
    ) -> Result<(), BoxError> {
        poll_until(what, timeout, || async move {
            Ok((self.count(expr, None).await >= series).then_some(()))
        })
        .await
    }

    /// Sends every expression of the three dashboards, evaluated at `at` (Unix seconds; now if
    /// `None`). Each must parse; each whose metric families all have series then must return
    /// data, and every dashboard variable must have values. Returns how many expressions
    /// returned data, or every failure in one error.
    pub async fn check_dashboards(&self, at: Option<f64>) -> Result<usize, BoxError> {
        let mut failures = Vec::new();
        let mut answered = 0;
        // whether a metric family has series at `at`, asked once per family
        let mut present: std::collections::BTreeMap<String, bool> = Default::default();
        let (expressions, variables) = dashboard_expressions()?;
        // a variable with no value leaves its dashboard empty: every one must have values
        for (title, expr) in &variables {
            let body = self.query(expr, at).await?;
            if body["data"]["result"].as_array().is_none_or(Vec::is_empty) {
                failures.push(format!("{title}: {expr} has no values"));
            }
        }
        for (title, expr) in expressions {
            let body = match self.query(&expr, at).await {
                Ok(body) => body,
                Err(error) => {
                    failures.push(format!("{title}: {error}"));
                    continue;
                }
            };
            let results = body["data"]["result"].as_array().map_or(0, Vec::len);
            // Every family the expression names has series: then the expression must return data.
            let mut all_present = true;
            for family in families(&expr) {
                let has_series = match present.get(&family) {
                    Some(known) => *known,
                    None => {
                        let series = self
                            .count(&format!("count({{__name__=~\"{family}(_bucket)?\"}})"), at)
                            .await;
                        *present.entry(family).or_insert(series > 0)
                    }
                };
                all_present &= has_series;
            }
            if all_present && results == 0 {
                failures.push(format!("{title}: {expr} returned no data"));
            }
            answered += usize::from(results > 0);
        }
        if failures.is_empty() {
            Ok(answered)
        } else {
            Err(failures.join("\n").into())
        }
    }
}

/// `text` with everything but unreserved URL characters percent-encoded.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every panel expression, and every variable's `label_values` as a query that must return
/// data, each with where it comes from.
type Expressions = Vec<(String, String)>;

fn dashboard_expressions() -> Result<(Expressions, Expressions), BoxError> {
    let mut expressions = Vec::new();
    let mut variables = Vec::new();
    for name in ["operator.json", "jobs.json", "runtime.json"] {
        let text = std::fs::read_to_string(repo_root().join("dashboards").join(name))?;
        let dashboard: serde_json::Value = serde_json::from_str(&text)?;
        let unvar = |expr: &str| {
            ["$instance", "$namespace", "$trainingjob"]
                .iter()
                .fold(expr.to_owned(), |expr, var| expr.replace(var, ".*"))
        };
        for panel in dashboard["panels"].as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    let title = format!("{name}: {}", panel["title"].as_str().unwrap_or("?"));
                    expressions.push((title, unvar(expr)));
                }
            }
        }
        // the variables' `label_values(selector, label)`: a variable whose metric has no
        // series leaves its panels without a value to choose
        for variable in dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let Some(inner) = variable["definition"]
                .as_str()
                .and_then(|q| q.strip_prefix("label_values("))
                .and_then(|q| q.strip_suffix(')'))
            else {
                continue;
            };
            let Some((selector, label)) = inner.rsplit_once(',') else {
                continue;
            };
            let title = format!(
                "{name}: variable {}",
                variable["name"].as_str().unwrap_or("?")
            );
            // only series that carry the label give the variable a value
            let label = label.trim();
            let selector = unvar(selector);
            let selector = match selector.strip_suffix('}') {
                Some(open) => format!("{open}, {label}!=\"\"}}"),
                None => format!("{selector}{{{label}!=\"\"}}"),
            };
            variables.push((title, format!("count by ({label}) ({selector})")));
        }
    }
    Ok((expressions, variables))
}

/// Metric families an expression names (histogram suffixes folded).
fn families(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("ebbflow_"))
        .map(|word| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix))
                .unwrap_or(word)
                .to_owned()
        })
        .collect()
}
