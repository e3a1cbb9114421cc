//! The Grafana dashboards are well-formed and every expression references a metric the code
//! exports. (That every query returns data from a real Prometheus is checked by the end-to-end
//! suite.)

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `ebbflow_…` string literal in the Rust sources of `dir`: the metric names registered there.
fn exported_metric_names(dir: &Path, names: &mut BTreeSet<String>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            exported_metric_names(&path, names);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let text = fs::read_to_string(&path).unwrap();
            for literal in text.split('"').skip(1).step_by(2) {
                let is_name = literal.starts_with("ebbflow_")
                    && literal.len() > "ebbflow_".len()
                    && !literal.ends_with('_')
                    && literal
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if is_name {
                    names.insert(literal.to_string());
                }
            }
        }
    }
}

/// Metric names an expression references, with histogram/summary suffixes folded to the family.
fn referenced_metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut start = 0;
    while let Some(offset) = expr[start..].find("ebbflow_") {
        let begin = start + offset;
        let preceded_by_ident =
            begin > 0 && (bytes[begin - 1].is_ascii_alphanumeric() || bytes[begin - 1] == b'_');
        let mut end = begin;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if !preceded_by_ident {
            let name = &expr[begin..end];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            names.insert(family.to_string());
        }
        start = end;
    }
    names
}

fn dashboards() -> Vec<(PathBuf, serde_json::Value)> {
    let dir = repo_root().join("dashboards");
    let mut out: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| {
            let text = fs::read_to_string(&path).unwrap();
            let value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
            (path, value)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn the_expected_dashboards_exist() {
    let names: Vec<String> = dashboards()
        .iter()
        .map(|(path, _)| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for wanted in ["operator.json", "jobs.json", "runtime.json"] {
        assert!(
            names.iter().any(|n| n == wanted),
            "dashboards/{wanted} is missing"
        );
    }
}

#[test]
fn dashboards_are_well_formed_with_unique_panel_ids() {
    for (path, dashboard) in dashboards() {
        let shown = path.display();
        for key in ["uid", "title", "panels", "templating", "schemaVersion"] {
            assert!(dashboard.get(key).is_some(), "{shown}: missing {key}");
        }
        let panels = dashboard["panels"].as_array().unwrap();
        assert!(!panels.is_empty(), "{shown}: no panels");
        let mut ids = BTreeSet::new();
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or("?");
            assert!(
                ids.insert(panel["id"].as_u64().unwrap()),
                "{shown}: duplicate id at {title}"
            );
            let targets = panel["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "{shown}: panel {title} has no query");
            for target in targets {
                let expr = target["expr"].as_str().unwrap();
                assert!(
                    !expr.trim().is_empty(),
                    "{shown}: panel {title} has an empty expr"
                );
                let opens = expr.matches(['(', '{', '[']).count();
                let closes = expr.matches([')', '}', ']']).count();
                assert_eq!(opens, closes, "{shown}: unbalanced brackets in {expr}");
            }
        }
    }
}

#[test]
fn every_dashboard_expression_references_an_exported_metric() {
    let root = repo_root();
    let mut exported = BTreeSet::new();
    for dir in ["runtime/src", "operator/src", "operator/job/src"] {
        exported_metric_names(&root.join(dir), &mut exported);
    }
    assert!(
        exported.len() > 10,
        "found too few metric names: {exported:?}"
    );
    let mut unknown = Vec::new();
    for (path, dashboard) in dashboards() {
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                let referenced = referenced_metric_names(expr);
                assert!(
                    !referenced.is_empty(),
                    "{}: {expr} uses no ebbflow metric",
                    path.display()
                );
                for name in referenced {
                    if !exported.contains(&name) {
                        unknown.push(format!("{}: {name}", path.display()));
                    }
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "dashboards reference metrics the code does not export: {unknown:#?}"
    );
}

#[test]
fn the_reference_extractor_folds_histogram_suffixes() {
    let names = referenced_metric_names(
        "histogram_quantile(0.9, rate(ebbflow_x_seconds_bucket[5m])) / my_ebbflow_y",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["ebbflow_x_seconds"]
    );
}

#[test]
fn the_chart_ships_the_same_dashboards() {
    let root = repo_root();
    for (path, _) in dashboards() {
        let name = path.file_name().unwrap();
        let shipped = root.join("charts/ebbflow/dashboards").join(name);
        let shipped = fs::read(&shipped)
            .unwrap_or_else(|e| panic!("chart is missing {}: {e}", shipped.display()));
        assert_eq!(
            shipped,
            fs::read(&path).unwrap(),
            "{} differs in the chart",
            path.display()
        );
    }
}
