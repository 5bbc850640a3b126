// SPDX-License-Identifier: Apache-2.0
//! `proxy-agent inspect`: the vocabulary of the subcommand (what to show, in which form).
//! Each mode reads and renders its own live state (the readers live in the mode folders
//! and are registered with the mode, see [`crate::proxier::ModeTools`]); the subcommand
//! asks the registry which mode answers a subject.

/// What to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    Services,
    Backends,
    Affinity,
    Conntrack,
    Rules,
}

impl Subject {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "services" => Some(Self::Services),
            "backends" => Some(Self::Backends),
            "affinity" => Some(Self::Affinity),
            "conntrack" => Some(Self::Conntrack),
            "rules" => Some(Self::Rules),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Services => "services",
            Self::Backends => "backends",
            Self::Affinity => "affinity",
            Self::Conntrack => "conntrack",
            Self::Rules => "rules",
        }
    }
}

/// In which form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

impl Output {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "text" => Some(Self::Text),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// Lays rows out in columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    use std::fmt::Write as _;
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let _ = write!(s, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}
