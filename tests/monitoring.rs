//! The chart's alerts (`charts/redlock-operator/files/prometheus-rules.yaml`) and Grafana dashboard
//! (`files/dashboard.json`) against what the operator serves on `/metrics`: every metric an alert expression
//! or a dashboard query names is a series the operator exposes (a counter's `_total`, a histogram's
//! `_bucket`/`_sum`/`_count`), every expression parses as PromQL, every alert has an entry in the runbook
//! (docs/how-to/runbook.md), and every metric is in the runbook's table and on the dashboard. The negative
//! controls at the end show that the check catches a wrong name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use redlock_operator::telemetry::metrics::{Metrics, OutcomeLabels};
use serde::Deserialize;

fn repo_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_file(relative)).unwrap_or_else(|err| panic!("read {relative}: {err}"))
}

/// The series names the operator's registry exposes, from its `# TYPE` lines: a family's samples may not
/// exist yet (a labelled family before its first use), but its type says which names its samples take.
fn exposed_series() -> BTreeSet<String> {
    let metrics = Metrics::default();
    // Every family gets a sample, so that the encoded samples can confirm the names derived from the types.
    metrics.set_master_state("q", "redis://a:6379", "up");
    metrics.set_quorum_masters("q", 3, 3);
    metrics
        .acquire_seconds
        .get_or_create(&OutcomeLabels {
            outcome: "acquired".to_owned(),
        })
        .observe(0.001);
    let text = metrics.encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(declaration) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = declaration.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            panic!("malformed TYPE line: {line}");
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            "gauge" => {
                names.insert(name.to_owned());
            }
            other => panic!("{name}: a metric type this test does not know: {other}"),
        }
    }
    let samples: BTreeSet<String> = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    assert!(
        samples.is_subset(&names),
        "samples not covered by the TYPE-derived names: {:?}",
        samples.difference(&names).collect::<Vec<_>>()
    );
    assert!(names.len() > 10, "{names:?}");
    names
}

/// A family's name as the runbook's table writes it: counters with `_total`, histograms without a suffix.
fn families(series: &BTreeSet<String>) -> BTreeSet<String> {
    series
        .iter()
        .map(|name| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name)
                .to_owned()
        })
        .collect()
}

struct MetricNames(Result<BTreeSet<String>, String>);

impl ExprVisitor for MetricNames {
    type Error = String;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
        let selector = match expr {
            Expr::VectorSelector(selector) => selector,
            Expr::MatrixSelector(matrix) => &matrix.vs,
            _ => return Ok(true),
        };
        match &selector.name {
            Some(name) => {
                if let Ok(names) = &mut self.0 {
                    names.insert(name.clone());
                }
                Ok(true)
            }
            None => Err(format!("a selector without a metric name: {selector}")),
        }
    }
}

/// The metric names a PromQL expression selects; an error when it does not parse or a selector names no
/// metric (which this check could not verify).
fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let ast = parser::parse(expr).map_err(|err| format!("does not parse: {err}"))?;
    let mut visitor = MetricNames(Ok(BTreeSet::new()));
    walk_expr(&mut visitor, &ast)?;
    visitor.0
}

/// Problems of one expression: parse errors and names that are not exposed series.
fn check_expression(
    origin: &str,
    expr: &str,
    exposed: &BTreeSet<String>,
    used: &mut BTreeSet<String>,
) -> Vec<String> {
    match metric_names(expr) {
        Err(err) => vec![format!("{origin}: {err}: {expr}")],
        Ok(names) => {
            let unknown: Vec<String> = names.difference(exposed).cloned().collect();
            used.extend(names);
            if unknown.is_empty() {
                Vec::new()
            } else {
                vec![format!("{origin}: not served on /metrics: {unknown:?} in {expr}")]
            }
        }
    }
}

#[derive(Deserialize)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Deserialize)]
struct RuleGroup {
    rules: Vec<Rule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    for_: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

/// The rules file with its `${name}` placeholders replaced by the chart's default thresholds, as the chart's
/// template does.
fn rules_with_default_thresholds() -> Vec<Rule> {
    let values: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read("charts/redlock-operator/values.yaml")).expect("values.yaml parses");
    let thresholds = values["metrics"]["prometheusRule"]["thresholds"]
        .as_mapping()
        .expect("metrics.prometheusRule.thresholds in values.yaml");
    // Comments may mention the placeholder syntax; only the YAML itself is substituted and checked.
    let mut text: String = read("charts/redlock-operator/files/prometheus-rules.yaml")
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .map(|line| format!("{line}\n"))
        .collect();
    for (name, value) in thresholds {
        let name = name.as_str().expect("threshold names are strings");
        let value = match value {
            serde_yaml_ng::Value::String(text) => text.clone(),
            serde_yaml_ng::Value::Number(number) => number.to_string(),
            other => panic!("threshold {name}: neither a number nor a duration: {other:?}"),
        };
        let placeholder = format!("${{{name}}}");
        assert!(
            text.contains(&placeholder),
            "threshold {name} is used by no alert"
        );
        text = text.replace(&placeholder, &value);
    }
    assert!(
        !text.contains("${"),
        "a placeholder without a threshold in values.yaml"
    );
    let file: RuleFile = serde_yaml_ng::from_str(&text).expect("the rules file parses");
    file.groups.into_iter().flat_map(|group| group.rules).collect()
}

/// Every PromQL expression of the dashboard (panel targets, also inside rows, and the variables' queries),
/// with Grafana's variables replaced by values of their kind.
fn dashboard_expressions(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn panels(list: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for panel in list.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("(untitled)");
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().expect("every target has an expr");
                out.push((format!("panel {title:?}"), expr.to_owned()));
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .expect("a query variable has a query");
        let selector = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.rsplit_once(','))
            .map(|(selector, _label)| selector.trim())
            .expect("query variables use label_values(metric, label)");
        out.push((format!("variable {}", variable["name"]), selector.to_owned()));
    }
    out.into_iter()
        .map(|(origin, expr)| (origin, substitute_grafana_variables(&expr)))
        .collect()
}

/// Grafana's built-in range variables become a duration, the dashboard's own variables (label matchers only) a
/// regular expression.
fn substitute_grafana_variables(expr: &str) -> String {
    let mut text = expr.to_owned();
    for range in ["$__rate_interval", "$__interval", "$__range"] {
        text = text.replace(range, "5m");
    }
    for variable in ["${quorum}", "$quorum"] {
        text = text.replace(variable, ".*");
    }
    text
}

fn runbook() -> String {
    read("docs/how-to/runbook.md")
}

#[test]
fn alerts_use_only_served_metrics_and_each_has_a_runbook_entry() {
    let exposed = exposed_series();
    let runbook = runbook();
    let rules = rules_with_default_thresholds();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for rule in &rules {
        let origin = format!("alert {}", rule.alert);
        problems.extend(check_expression(&origin, &rule.expr, &exposed, &mut used));
        if !seen.insert(&rule.alert) {
            problems.push(format!("{origin}: defined twice"));
        }
        if !matches!(
            rule.labels.get("severity").map(String::as_str),
            Some("critical" | "warning")
        ) {
            problems.push(format!("{origin}: severity must be critical or warning"));
        }
        if !rule.for_.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            problems.push(format!("{origin}: `for` is not a duration: {}", rule.for_));
        }
        for annotation in ["summary", "description"] {
            if rule
                .annotations
                .get(annotation)
                .is_none_or(|text| text.trim().is_empty())
            {
                problems.push(format!("{origin}: no {annotation}"));
            }
        }
        if !runbook
            .lines()
            .any(|line| line.trim() == format!("#### {}", rule.alert))
        {
            problems.push(format!(
                "{origin}: no runbook entry `#### {}` in docs/how-to/runbook.md",
                rule.alert
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // What the issue asked to alert on.
    for alert in [
        "RedlockLocksLost",
        "RedlockQuorumUnavailable",
        "RedlockQuorumDegraded",
        "RedlockNoActiveReplica",
        "RedlockExtensionLagHigh",
        "RedlockReconcileErrors",
    ] {
        assert!(rules.iter().any(|rule| rule.alert == alert), "{alert} missing");
    }
    let schema: serde_json::Value =
        serde_json::from_str(&read("charts/redlock-operator/values.schema.json")).expect("schema parses");
    let disabled = &schema["properties"]["metrics"]["properties"]["prometheusRule"]["properties"]["disabled"];
    let mut allowed: Vec<&str> = disabled["items"]["enum"]
        .as_array()
        .expect("the schema lists the alerts that can be disabled")
        .iter()
        .filter_map(|name| name.as_str())
        .collect();
    let mut defined: Vec<&str> = rules.iter().map(|rule| rule.alert.as_str()).collect();
    allowed.sort_unstable();
    defined.sort_unstable();
    assert_eq!(
        allowed, defined,
        "values.schema.json's metrics.prometheusRule.disabled names the alerts"
    );
}

#[test]
fn dashboard_queries_use_only_served_metrics_and_show_every_metric() {
    let exposed = exposed_series();
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("charts/redlock-operator/files/dashboard.json"))
            .expect("dashboard parses");
    let expressions = dashboard_expressions(&dashboard);
    assert!(expressions.len() > 10, "{expressions:?}");
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (origin, expr) in &expressions {
        if expr.contains('$') {
            problems.push(format!(
                "{origin}: a Grafana variable this check does not know: {expr}"
            ));
            continue;
        }
        problems.extend(check_expression(origin, expr, &exposed, &mut used));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let shown = families(&used);
    let missing: Vec<String> = families(&exposed).difference(&shown).cloned().collect();
    assert!(
        missing.is_empty(),
        "metrics no dashboard panel shows: {missing:?}"
    );
}

#[test]
fn runbook_metrics_table_lists_every_metric() {
    let runbook = runbook();
    let missing: Vec<String> = families(&exposed_series())
        .into_iter()
        .filter(|family| !runbook.contains(&format!("| `{family}")))
        .collect();
    assert!(
        missing.is_empty(),
        "the runbook's metrics table lacks {missing:?}"
    );
}

// Negative controls: the check reports what it must.

#[test]
fn wrong_names_and_suffixes_are_reported() {
    let exposed = exposed_series();
    let mut used = BTreeSet::new();
    for (expr, wrong) in [
        // A misspelt metric.
        (
            "increase(redlock_lock_lost_total[5m]) > 0",
            "redlock_lock_lost_total",
        ),
        // A counter without its `_total`.
        ("rate(redlock_extensions[5m])", "redlock_extensions"),
        // A gauge given a counter's suffix.
        ("redlock_locks_held_total > 0", "redlock_locks_held_total"),
        // A histogram's family name, which is no series.
        ("redlock_extend_lag_seconds > 1", "redlock_extend_lag_seconds"),
        // The second operand of a binary expression is checked too.
        (
            "redlock_quorum_masters_eligible < redlock_quorum_master_required",
            "redlock_quorum_master_required",
        ),
    ] {
        let problems = check_expression("control", expr, &exposed, &mut used);
        assert!(
            problems.len() == 1 && problems[0].contains(wrong),
            "{expr}: {problems:?}"
        );
    }
    for expr in [
        "sum(rate(redlock_extensions_total[5m])",
        r#"{__name__=~"redlock_.*"}"#,
    ] {
        assert_eq!(
            check_expression("control", expr, &exposed, &mut used).len(),
            1,
            "{expr}"
        );
    }
    // And the same expressions with the right names pass.
    for expr in [
        "increase(redlock_locks_lost_total[5m]) > 0",
        "histogram_quantile(0.99, sum by (le) (rate(redlock_extend_lag_seconds_bucket[5m])))",
    ] {
        assert!(
            check_expression("control", expr, &exposed, &mut used).is_empty(),
            "{expr}"
        );
    }
}

#[test]
fn grafana_variables_become_valid_promql() {
    let expr = substitute_grafana_variables(
        r#"sum by (quorum) (rate(redlock_reconcile_errors_total{quorum=~"$quorum"}[$__rate_interval]))"#,
    );
    assert!(metric_names(&expr).is_ok(), "{expr}");
    let unknown = substitute_grafana_variables("rate(redlock_extensions_total[$window])");
    assert!(
        unknown.contains('$'),
        "an unknown variable is left for the check to report"
    );
}
