// SPDX-License-Identifier: Apache-2.0
//! Reading the agent's Prometheus text exposition (pure): the value of each label set of a
//! metric, and their sum.

/// Each sample of the metric `name` (exact, so `x_sum` is not `x`): its label text (what
/// is between the braces, empty without labels) and its value.
pub fn samples<'a>(text: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        if &line[..end] != name {
            continue;
        }
        let (labels, rest) = match line[end..].strip_prefix('{') {
            Some(labelled) => labelled.split_once('}').unwrap_or(("", "")),
            None => ("", &line[end..]),
        };
        // A sample may carry a timestamp after its value.
        if let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            out.push((labels, value));
        }
    }
    out
}

/// The sum of a counter or histogram `_count` over its label sets.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let values = samples(text, name);
    (!values.is_empty()).then(|| values.iter().map(|(_, v)| v).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_adds_label_sets() {
        let text = "# HELP x\n\
                    kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 3\n\
                    kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 2\n\
                    kubeproxy_sync_full_proxy_rules_duration_seconds_sum 0.5\n";
        let name = "kubeproxy_sync_full_proxy_rules_duration_seconds_count";
        assert_eq!(metric_sum(text, name), Some(5.0));
        assert_eq!(metric_sum(text, "missing"), None);
    }

    #[test]
    fn samples_keep_their_labels_and_skip_other_names() {
        let text = "x{map=\"svc_v4\",family=\"IPv4\"} 2 1700000000\n\
                    x_total 9\n\
                    x 1.5\n\
                    x{a=\"b\"} not-a-number\n";
        assert_eq!(
            samples(text, "x"),
            vec![("map=\"svc_v4\",family=\"IPv4\"", 2.0), ("", 1.5)]
        );
        assert!(samples(text, "y").is_empty());
    }
}
