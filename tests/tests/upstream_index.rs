// SPDX-License-Identifier: Apache-2.0
//! tests/scenarios/UPSTREAM.md, the index of upstream tests and where they are covered, is
//! checked against the tree so that it cannot rot: every scenario reference in its table
//! (`file.yaml#N`, `short#N-M`, a following `#K` of the same file) names one existing file
//! whose flows go that far, every test reference (`path::name`, a following `::other`) names
//! a function that exists, and every scenario file of tests/scenarios appears in it. No root
//! needed.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use tests::scenario::Scenario;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

fn index_text() -> String {
    let path = workspace().join("tests/scenarios/UPSTREAM.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The table rows' "covered by" and "note" cells.
fn reference_cells(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_index = false;
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("## ") {
            in_index = line == "## Index";
            continue;
        }
        if !in_index || !line.starts_with('|') || line.starts_with("| upstream file") {
            continue;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        if cells.iter().all(|c| c.trim().chars().all(|ch| ch == '-')) {
            continue;
        }
        assert_eq!(cells.len(), 4, "line {}: not four cells: {line}", n + 1);
        for cell in &cells[2..] {
            out.push((n + 1, cell.replace('`', " ")));
        }
    }
    out
}

/// Every scenario file: (file stem, path), shared and own.
fn scenario_files() -> Vec<(String, PathBuf)> {
    let ws = workspace();
    let mut out = Vec::new();
    for dir in [ws.join("../shared/scenarios"), ws.join("tests/scenarios")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.extension().is_some_and(|e| e == "yaml")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            {
                out.push((stem.to_string(), path.clone()));
            }
        }
    }
    out
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

/// The scenario file a name in the index means: `shared/scenarios/x.yaml`, `x.yaml`, `x`, or
/// a prefix of one file's name up to a dash (`t01` for `t01-topology-…`).
fn resolve_scenario<'a>(files: &'a [(String, PathBuf)], name: &str) -> Result<&'a Path, String> {
    let bare = name
        .rsplit('/')
        .next()
        .unwrap_or(name)
        .trim_end_matches(".yaml");
    let found: Vec<&(String, PathBuf)> = files
        .iter()
        .filter(|(stem, _)| stem == bare || stem.starts_with(&format!("{bare}-")))
        .collect();
    match found.as_slice() {
        [(_, path)] => Ok(path),
        [] => Err(format!("no scenario file for {name:?}")),
        many => {
            // An exact name wins over longer names it prefixes.
            match many.iter().find(|(stem, _)| stem == bare) {
                Some((_, path)) => Ok(path),
                None => Err(format!("{name:?} names {} files", many.len())),
            }
        }
    }
}

fn flow_count(path: &Path) -> usize {
    Scenario::load(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .flows()
        .count()
}

/// The scenario references of one cell: (name as written, first flow, last flow).
fn scenario_refs(cell: &str) -> Vec<(String, usize, usize)> {
    let chars: Vec<char> = cell.chars().collect();
    let mut out = Vec::new();
    let mut last_name: Option<String> = None;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '#' || !chars.get(i + 1).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
            continue;
        }
        let mut start = i;
        while start > 0 && is_name_char(chars[start - 1]) {
            start -= 1;
        }
        let mut written: String = chars[start..i].iter().collect();
        if written.is_empty() {
            // `name #3`: a scenario name (they all hold a digit) before the space; `and #4`
            // continues the last one.
            let mut end = i;
            while end > 0 && chars[end - 1] == ' ' {
                end -= 1;
            }
            let mut begin = end;
            while begin > 0 && is_name_char(chars[begin - 1]) {
                begin -= 1;
            }
            let word: String = chars[begin..end].iter().collect();
            if word.chars().any(|c| c.is_ascii_digit()) && !word.ends_with(".rs") {
                written = word;
            }
        }
        let mut written = written.trim_start_matches('/').to_string();
        if !written.chars().any(|c| c.is_ascii_alphabetic()) {
            // `#13/#14`: the second continues the first's file.
            written.clear();
        }
        let name = if written.is_empty() {
            last_name.clone()
        } else {
            Some(written)
        };
        let number = |from: &mut usize| -> usize {
            let begin = *from;
            while *from < chars.len() && chars[*from].is_ascii_digit() {
                *from += 1;
            }
            chars[begin..*from]
                .iter()
                .collect::<String>()
                .parse()
                .unwrap_or(0)
        };
        let mut j = i + 1;
        let first = number(&mut j);
        let mut last = first;
        if chars.get(j) == Some(&'-') || chars.get(j) == Some(&'–') {
            let mut k = j + 1;
            if chars.get(k) == Some(&'#') {
                k += 1;
            }
            if chars.get(k).is_some_and(|c| c.is_ascii_digit()) {
                last = number(&mut k);
                j = k;
            }
        }
        if let Some(name) = name {
            out.push((name.clone(), first, last));
            last_name = Some(name);
        }
        i = j;
    }
    out
}

/// `*.yaml` names written in a cell without a flow number (whole files), except elided ones.
fn whole_file_refs(cell: &str) -> Vec<String> {
    cell.split(|c: char| !is_name_char(c))
        .filter(|w| w.ends_with(".yaml") && w.len() > ".yaml".len())
        .map(|w| w.trim_start_matches('/').to_string())
        .collect()
}

#[test]
fn scenario_references_name_existing_files_and_flows() {
    let files = scenario_files();
    if files
        .iter()
        .all(|(_, p)| !p.starts_with(workspace().join("../shared")))
    {
        eprintln!("skipping: ../shared/scenarios not present");
        return;
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for (line, cell) in reference_cells(&index_text()) {
        for (name, first, last) in scenario_refs(&cell) {
            match resolve_scenario(&files, &name) {
                Ok(path) => {
                    let count = flow_count(path);
                    if first == 0 || first > last || last > count {
                        problems.push(format!(
                            "line {line}: {name}#{first}-{last}: the file has {count} flows"
                        ));
                    }
                    checked += 1;
                }
                Err(why) => problems.push(format!("line {line}: {why}")),
            }
        }
        for name in whole_file_refs(&cell) {
            if let Err(why) = resolve_scenario(&files, &name) {
                problems.push(format!("line {line}: {why}"));
            }
            checked += 1;
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked > 200, "only {checked} scenario references found");
}

/// Rust sources of the workspace (not target/), by path relative to the workspace.
fn rust_sources(dir: &Path, ws: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !matches!(name, "target" | ".git") {
                rust_sources(&path, ws, out);
            }
        } else if name.ends_with(".rs")
            && let Ok(relative) = path.strip_prefix(ws)
        {
            out.push(relative.to_path_buf());
        }
    }
}

/// The test references of one cell: (file as written, function name). `a.rs::m::name`
/// skips the module path; `, ::other` after a reference names another function of its file.
fn test_refs(cell: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut last_file: Option<String> = None;
    for (at, _) in cell.match_indices("::") {
        let rest = &cell[at + 2..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let starts_like_a_name = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
        if !starts_like_a_name || rest[name.len()..].starts_with("::") {
            continue;
        }
        let written: String = cell[..at]
            .chars()
            .rev()
            .take_while(|c| is_name_char(*c) || *c == ':')
            .collect::<Vec<char>>()
            .into_iter()
            .rev()
            .collect();
        let file = written.split("::").next().unwrap_or("").to_string();
        if file.ends_with(".rs") {
            out.push((file.clone(), name));
            last_file = Some(file);
        } else if written.is_empty()
            && let Some(file) = &last_file
        {
            out.push((file.clone(), name));
        }
    }
    out
}

#[test]
fn test_references_name_existing_functions() {
    let ws = workspace();
    let mut sources = Vec::new();
    rust_sources(&ws, &ws, &mut sources);
    let mut problems = Vec::new();
    let mut checked = 0;
    for (line, cell) in reference_cells(&index_text()) {
        for (file, name) in test_refs(&cell) {
            let candidates: Vec<&PathBuf> = sources
                .iter()
                .filter(|p| {
                    let p = p.to_string_lossy();
                    p == file.as_str() || p.ends_with(&format!("/{file}"))
                })
                .collect();
            let defines = |p: &PathBuf| {
                std::fs::read_to_string(ws.join(p)).is_ok_and(|text| {
                    text.contains(&format!("fn {name}(")) || text.contains(&format!("fn {name}<"))
                })
            };
            if candidates.is_empty() {
                problems.push(format!("line {line}: no source file {file:?}"));
            } else if !candidates.iter().any(|p| defines(p)) {
                problems.push(format!("line {line}: {file}::{name}: no such function"));
            }
            checked += 1;
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked > 100, "only {checked} test references found");
}

#[test]
fn every_own_scenario_file_is_in_the_index() {
    let text = index_text();
    let own: BTreeSet<String> = scenario_files()
        .into_iter()
        .filter(|(_, p)| p.starts_with(workspace().join("tests/scenarios")))
        .map(|(stem, _)| stem)
        .collect();
    let shared: BTreeSet<String> = scenario_files()
        .into_iter()
        .filter(|(_, p)| !p.starts_with(workspace().join("tests/scenarios")))
        .map(|(stem, _)| stem)
        .collect();
    let missing: Vec<&String> = own
        .iter()
        .filter(|stem| {
            let twin_of_shared = stem
                .strip_prefix("v6-")
                .is_some_and(|base| shared.contains(base));
            // A v6 twin of one of our files is named with it ("`x.yaml` (+ v6)", "v6-x…").
            let twin_of_listed = stem.strip_prefix("v6-").is_some_and(|base| {
                let short = base.split('-').next().unwrap_or(base);
                text.contains(base) || text.contains(&format!("v6-{short}"))
            });
            !(text.contains(stem.as_str()) || twin_of_shared || twin_of_listed)
        })
        .collect();
    assert!(missing.is_empty(), "not in UPSTREAM.md: {missing:?}");
}

#[test]
fn reference_parsing() {
    assert_eq!(
        scenario_refs("t01#3 (and #4: x); shared m5#1-2, e6#6-7, p09 #1-#16, #13/#14"),
        vec![
            ("t01".to_string(), 3, 3),
            ("t01".to_string(), 4, 4),
            ("m5".to_string(), 1, 2),
            ("e6".to_string(), 6, 7),
            ("p09".to_string(), 1, 16),
            ("p09".to_string(), 13, 13),
            ("p09".to_string(), 14, 14),
        ]
    );
    assert_eq!(
        test_refs("a/b.rs::one, ::two; c.rs::tests::three (`::1/128`)"),
        vec![
            ("a/b.rs".to_string(), "one".to_string()),
            ("a/b.rs".to_string(), "two".to_string()),
            ("c.rs".to_string(), "three".to_string()),
        ]
    );
    assert_eq!(
        whole_file_refs("shared/scenarios/l1-headless-ignored.yaml; v6-e1-… (+ v6)"),
        vec!["shared/scenarios/l1-headless-ignored.yaml".to_string()]
    );
}
