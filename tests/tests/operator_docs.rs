// SPDX-License-Identifier: Apache-2.0
//! README.md's troubleshooting table quotes the agent's messages: each quoted message must
//! be in the agent's source as it is logged, so that an operator who searches the README
//! for a line of the log finds it, and a reworded message cannot leave the table behind.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The agent's source with string continuations joined (`"a \` + newline + indentation +
/// `b"` reads `"a b"`), as the message is printed.
fn agent_source() -> String {
    let mut files = Vec::new();
    rust_files(&repo().join("proxy-agent/src"), &mut files);
    let mut text = String::new();
    for file in files {
        let source = std::fs::read_to_string(&file).unwrap();
        let mut continued = false;
        for line in source.lines() {
            let line = if continued { line.trim_start() } else { line };
            match line.strip_suffix('\\') {
                Some(head) => {
                    text.push_str(head);
                    continued = true;
                }
                None => {
                    text.push_str(line);
                    text.push('\n');
                    continued = false;
                }
            }
        }
    }
    text
}

/// The first column of the table under "### Troubleshooting", without backticks.
fn quoted_messages(readme: &str) -> Vec<String> {
    let section = readme
        .split("### Troubleshooting")
        .nth(1)
        .expect("README.md has a Troubleshooting section");
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let first = l.split('|').nth(1).unwrap().trim();
            let quoted = first.split('`').nth(1).unwrap();
            quoted.to_string()
        })
        .collect()
}

#[test]
fn every_troubleshooting_message_is_one_the_agent_logs() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let messages = quoted_messages(&readme);
    assert!(messages.len() >= 10, "the table lists {messages:?}");
    let source = agent_source();
    let missing: Vec<&String> = messages
        .iter()
        .filter(|m| !source.contains(m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md quotes messages the agent does not log: {missing:?}"
    );
}

#[test]
fn continued_strings_are_joined_and_a_reworded_message_is_caught() {
    let messages = quoted_messages(
        "### Troubleshooting\n| message | cause |\n| --- | --- |\n| `BPF maps full: services not programmed` | x |\n",
    );
    assert_eq!(messages, ["BPF maps full: services not programmed"]);
    let source = agent_source();
    assert!(source.contains("BPF maps full: services not programmed (the rest is"));
    assert!(!source.contains("BPF maps are full: services"));
}
