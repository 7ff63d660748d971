//! The results: a table for people, JSON for machines.

use serde::Serialize;

use crate::plan::Section;
use crate::stats::Samples;
use crate::svg::Chart;

#[derive(Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gb: f64,
    pub kernel: String,
    pub redis: String,
    /// `etcd --version`'s first line (empty when etcd is not installed).
    pub etcd: String,
}

impl Machine {
    /// One line for a picture: `2 x AMD EPYC, Redis 7.0.15, quick mode`.
    pub fn short(&self, quick: bool) -> String {
        let redis = self
            .redis
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .unwrap_or("?");
        format!(
            "{} x {}, Linux {}, Redis {redis}, over loopback{}",
            self.cpus,
            self.cpu_model,
            self.kernel,
            if quick { ", quick mode" } else { "" }
        )
    }

    pub fn describe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let redis = std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let etcd = etcd_process::find_etcd()
            .ok()
            .and_then(|etcd| {
                std::process::Command::new(etcd)
                    .arg("--version")
                    .output()
                    .ok()
            })
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
                .unwrap_or_default(),
            memory_gb: meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                .map_or(0.0, |kb| kb / 1024.0 / 1024.0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            redis,
            etcd,
        }
    }
}

/// One figure: tenure's value, the naive baseline's, and the goal.
#[derive(Debug, Serialize)]
pub struct Row {
    pub figure: String,
    pub tenure: String,
    pub baseline: String,
    /// tenure / baseline, when both are numbers.
    pub ratio: Option<f64>,
    pub target: String,
    /// `None` when the figure has no target.
    pub met: Option<bool>,
    pub tenure_value: f64,
    pub baseline_value: Option<f64>,
    /// What the baseline column holds when it is not the naive baseline:
    /// `"Redis"` in the etcd section, where the same measurement of tenure
    /// on a redis-server of the same run stands beside the etcd figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_is: Option<String>,
    /// What exactly is measured, when the figure's name cannot say it all
    /// (printed under the table, numbered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Row {
    /// p50 / p99 latencies, in ms.
    pub fn latency(figure: &str, tenure: &Samples, baseline: Option<&Samples>) -> Row {
        Row {
            figure: format!("{figure}, p50 / p99 ms"),
            tenure: format!("{:.3} / {:.3}", tenure.p50(), tenure.p99()),
            baseline: baseline.map_or("-".into(), |b| format!("{:.3} / {:.3}", b.p50(), b.p99())),
            ratio: baseline.map(|b| tenure.p50() / b.p50()),
            target: String::new(),
            met: None,
            tenure_value: tenure.p50(),
            baseline_value: baseline.map(Samples::p50),
            baseline_is: None,
            note: None,
        }
    }

    /// A latency row with a target on its p99.
    pub fn latency_target(
        figure: &str,
        tenure: &Samples,
        baseline: Option<&Samples>,
        target: &str,
        met: bool,
    ) -> Row {
        let mut row = Row::latency(figure, tenure, baseline);
        row.ratio = baseline.map(|b| tenure.p99() / b.p99());
        row.tenure_value = tenure.p99();
        row.baseline_value = baseline.map(Samples::p99);
        row.target = target.into();
        row.met = Some(met);
        row
    }

    /// p50 / p90 / p99 latencies in ms, tenure only, with a target met or
    /// not; the value is the p99.
    pub fn percentiles(figure: &str, tenure: &Samples, target: &str, met: Option<bool>) -> Row {
        Row {
            figure: format!("{figure}, p50 / p90 / p99 ms"),
            tenure: format!(
                "{:.3} / {:.3} / {:.3}",
                tenure.p50(),
                tenure.p90(),
                tenure.p99()
            ),
            baseline: "-".into(),
            ratio: None,
            target: target.into(),
            met,
            tenure_value: tenure.p99(),
            baseline_value: None,
            baseline_is: None,
            note: None,
        }
    }

    /// A ratio to the floor, tenure's and the baseline's.
    pub fn ratio(
        figure: &str,
        tenure: f64,
        baseline: f64,
        target: &str,
        goal: impl Fn(f64) -> bool,
    ) -> Row {
        Row {
            figure: figure.into(),
            tenure: format!("{tenure:.2}x"),
            baseline: format!("{baseline:.2}x"),
            ratio: Some(tenure / baseline),
            target: target.into(),
            met: Some(goal(tenure)),
            tenure_value: tenure,
            baseline_value: Some(baseline),
            baseline_is: None,
            note: None,
        }
    }

    pub fn plain(figure: &str, tenure: f64, baseline: Option<f64>, target: &str, met: bool) -> Row {
        Row {
            figure: figure.into(),
            tenure: format!("{tenure:.2}"),
            baseline: baseline.map_or("-".into(), |b| format!("{b:.2}")),
            ratio: baseline.filter(|b| *b != 0.0).map(|b| tenure / b),
            target: target.into(),
            met: Some(met),
            tenure_value: tenure,
            baseline_value: baseline,
            baseline_is: None,
            note: None,
        }
    }

    /// Say what the baseline column holds (see [`Row::baseline_is`]); the
    /// table prefixes the baseline's figure with it.
    pub fn against(mut self, what: &str) -> Row {
        if self.baseline != "-" {
            self.baseline = format!("{what}: {}", self.baseline);
        }
        self.baseline_is = Some(what.into());
        self
    }

    /// Explain the row (see [`Row::note`]).
    pub fn noted(mut self, note: impl Into<String>) -> Row {
        self.note = Some(note.into());
        self
    }

    /// Keep or drop the target of a row.
    pub fn targeted(mut self, has_target: bool) -> Row {
        if !has_target {
            self.target = String::new();
            self.met = None;
        }
        self
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub quick: bool,
    /// The sections run (`--only`).
    pub sections: Vec<Section>,
    /// Wall time of the whole run.
    pub seconds: f64,
    pub rows: Vec<Row>,
    /// Sections that stopped on an error (`section: error`); their rows
    /// measured before the error are in `rows`.
    pub failures: Vec<String>,
    /// Latency distributions to draw (`--svg DIR`); not in the JSON, whose
    /// rows keep the percentiles.
    #[serde(skip)]
    pub charts: Vec<Chart>,
}

impl Report {
    pub fn new(machine: Machine, quick: bool, sections: Vec<Section>) -> Report {
        Report {
            machine,
            quick,
            sections,
            seconds: 0.0,
            rows: Vec::new(),
            failures: Vec::new(),
            charts: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Row) {
        self.rows.push(row);
    }

    /// A Markdown table.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let only = if self.sections.len() == Section::ALL.len() {
            String::new()
        } else {
            let names: Vec<&str> = self.sections.iter().map(|s| s.name()).collect();
            format!(" (only {})", names.join(", "))
        };
        let mut out = format!(
            "\nmachine: {} x {}, {:.0} GiB, Linux {}, {}{}{}{only}\n\n",
            m.cpus,
            m.cpu_model,
            m.memory_gb,
            m.kernel,
            m.redis
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            if self.sections.contains(&Section::Etcd) && !m.etcd.is_empty() {
                format!(", {}", m.etcd)
            } else {
                String::new()
            },
            if self.quick { " (quick mode)" } else { "" }
        );
        out.push_str("| figure | tenure | naive baseline | ratio | target | met? |\n|---|---|---|---|---|---|\n");
        let mut notes = Vec::new();
        for row in &self.rows {
            let figure = match &row.note {
                Some(note) => {
                    notes.push(note.as_str());
                    format!("{} [{}]", row.figure, notes.len())
                }
                None => row.figure.clone(),
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                figure,
                row.tenure,
                row.baseline,
                row.ratio.map_or("-".into(), |r| format!("{r:.2}")),
                if row.target.is_empty() {
                    "-"
                } else {
                    &row.target
                },
                match row.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "-",
                }
            ));
        }
        if !notes.is_empty() {
            out.push_str("\nNotes:\n\n");
            for (n, note) in notes.iter().enumerate() {
                out.push_str(&format!("[{}] {note}\n", n + 1));
            }
        }
        for failure in &self.failures {
            out.push_str(&format!("\nsection failed, rows missing: {failure}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            cpus: 2,
            cpu_model: "cpu".into(),
            memory_gb: 1.0,
            kernel: "6".into(),
            redis: "Redis server v=7.0.15".into(),
            etcd: "etcd Version: 3.4.23".into(),
        }
    }

    #[test]
    fn the_table_names_the_sections_run_and_those_that_failed() {
        let mut report = Report::new(machine(), false, vec![Section::Cluster]);
        report.push(Row::plain("figure", 3.0, None, "<= 3", true));
        report.failures.push("cluster: it broke".into());
        let table = report.table();
        assert!(table.contains("(only cluster)"), "{table}");
        assert!(
            table.contains("| figure | 3.00 | - | - | <= 3 | yes |"),
            "{table}"
        );
        assert!(table.ends_with("section failed, rows missing: cluster: it broke\n"));

        let report = Report::new(machine(), false, Section::ALL.to_vec());
        assert!(!report.table().contains("only"), "every section: no note");
    }

    #[test]
    fn notes_are_numbered_under_the_table_and_a_baseline_says_what_it_is() {
        let mut report = Report::new(machine(), false, vec![Section::Etcd]);
        report.push(
            Row::plain("requests", 6.0, Some(3.0), "", true)
                .targeted(false)
                .against("Redis")
                .noted("counted by the members"),
        );
        report.push(Row::plain("plain", 1.0, None, "", true).against("Redis"));
        report.push(Row::plain("other", 2.0, None, "", true).noted("second note"));
        let table = report.table();
        assert!(
            table.contains("etcd Version: 3.4.23 (only etcd)"),
            "{table}"
        );
        assert!(
            table.contains("| requests [1] | 6.00 | Redis: 3.00 | 2.00 | - | - |"),
            "{table}"
        );
        assert!(
            table.contains("| plain | 1.00 | - |"),
            "no baseline, no prefix: {table}"
        );
        assert!(table.contains("| other [2] | 2.00 |"), "{table}");
        assert!(
            table.ends_with("Notes:\n\n[1] counted by the members\n[2] second note\n"),
            "{table}"
        );
        let json = serde_json::to_value(&report.rows[0]).expect("json");
        assert_eq!(json["baseline_is"], "Redis");
        assert_eq!(json["note"], "counted by the members");
        assert_eq!(json["baseline_value"], 3.0);
        let json = serde_json::to_value(&report.rows[2]).expect("json");
        assert!(json.get("baseline_is").is_none(), "left out when unset");

        let table = Report::new(machine(), false, vec![Section::Single]).table();
        assert!(!table.contains("etcd"), "no etcd section, no etcd version");
    }
}
