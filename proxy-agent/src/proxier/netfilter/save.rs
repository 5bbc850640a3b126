// SPDX-License-Identifier: Apache-2.0
//! The one reader of iptables text. `iptables-save` output, `iptables-restore` input and
//! `iptables -S` listings share a line format: `*table`, chain declarations
//! (`:NAME POLICY [packets:bytes]`), commands (`-A CHAIN rule...`, `-X CHAIN`, `-P CHAIN
//! ACCEPT`, optionally after `[packets:bytes]` counters), `COMMIT` and `#` comments. Every
//! user of that text (the proxiers' stale-chain and jump checks, cleanup, `inspect rules`,
//! `trace`, the tests' in-memory iptables) reads it through [`parse_line`] and splits rule
//! text into words with [`tokens`], which quotes as iptables-restore does.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// Packet and byte counters, `[packets:bytes]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
}

impl Counters {
    /// `[12:3456]`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let inner = text.strip_prefix('[')?.strip_suffix(']')?;
        let (packets, bytes) = inner.split_once(':')?;
        Some(Self {
            packets: packets.parse().ok()?,
            bytes: bytes.parse().ok()?,
        })
    }
}

/// A chain declaration, `:NAME POLICY [packets:bytes]` (the policy of a user chain is `-`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainDecl<'a> {
    pub name: &'a str,
    pub policy: &'a str,
    pub counters: Option<Counters>,
}

/// What a command line does to its chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `-A`: a rule at the end.
    Append,
    /// `-I`: a rule at the top (or at a position, which then starts the spec).
    Insert,
    /// `-D`: the rule with exactly this spec.
    Delete,
    /// `-N` (`iptables -S` lists user chains so).
    NewChain,
    /// `-X`.
    DeleteChain,
    /// `-F`.
    Flush,
    /// `-P` (`iptables -S` lists built-in chains so).
    Policy,
}

impl Op {
    fn parse(flag: &str) -> Option<Self> {
        Some(match flag {
            "-A" | "--append" => Op::Append,
            "-I" | "--insert" => Op::Insert,
            "-D" | "--delete" => Op::Delete,
            "-N" | "--new-chain" => Op::NewChain,
            "-X" | "--delete-chain" => Op::DeleteChain,
            "-F" | "--flush" => Op::Flush,
            "-P" | "--policy" => Op::Policy,
            _ => return None,
        })
    }
}

/// A command line: `-A CHAIN spec`, `-X CHAIN`, `-P CHAIN ACCEPT`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command<'a> {
    pub op: Op,
    pub chain: &'a str,
    /// What follows the chain, as written: the rule of -A/-I/-D, the policy of -P.
    pub spec: &'a str,
    /// The counters in front of the line (`iptables-save -c`).
    pub counters: Option<Counters>,
}

impl<'a> Command<'a> {
    /// The words of the spec.
    pub fn tokens(&self) -> Tokens<'a> {
        tokens(self.spec)
    }

    /// The `-j` target of the rule.
    pub fn target(&self) -> Option<Cow<'a, str>> {
        jump_target(self.spec)
    }

    /// Whether the rule's `--comment` is exactly `comment`.
    pub fn has_comment(&self, comment: &str) -> bool {
        let mut words = self.tokens();
        while let Some(word) = words.next() {
            if word == "--comment" && words.next().is_some_and(|c| c == comment) {
                return true;
            }
        }
        false
    }
}

/// One line of iptables text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// `*nat`: the table the following lines are in.
    Table(&'a str),
    Chain(ChainDecl<'a>),
    Command(Command<'a>),
    Commit,
    /// `# ...` (iptables-save writes its version and date so).
    Comment(&'a str),
    Blank,
    /// Text in none of these forms.
    Unknown(&'a str),
}

/// Classifies one line (surrounding whitespace ignored).
pub fn parse_line(line: &str) -> Line<'_> {
    let line = line.trim();
    if line.is_empty() {
        return Line::Blank;
    }
    if let Some(comment) = line.strip_prefix('#') {
        return Line::Comment(comment.trim_start());
    }
    if line == "COMMIT" {
        return Line::Commit;
    }
    if let Some(table) = line.strip_prefix('*') {
        return Line::Table(table.trim());
    }
    if let Some(decl) = line.strip_prefix(':') {
        let mut words = decl.split_ascii_whitespace();
        let Some(name) = words.next() else {
            return Line::Unknown(line);
        };
        return Line::Chain(ChainDecl {
            name,
            policy: words.next().unwrap_or("-"),
            counters: words.next().and_then(Counters::parse),
        });
    }
    let (counters, command) = match line.find(']') {
        Some(end) if line.starts_with('[') => (Counters::parse(&line[..=end]), &line[end + 1..]),
        _ => (None, line),
    };
    let (flag, rest) = split_word(command);
    let (chain, spec) = split_word(rest);
    match Op::parse(flag) {
        Some(op) if !chain.is_empty() => Line::Command(Command {
            op,
            chain,
            spec,
            counters,
        }),
        _ => Line::Unknown(line),
    }
}

/// Every line of `text`, classified.
pub fn lines(text: &str) -> impl Iterator<Item = Line<'_>> {
    text.lines().map(parse_line)
}

/// The command lines of `text`.
pub fn commands(text: &str) -> impl Iterator<Item = Command<'_>> {
    lines(text).filter_map(|line| match line {
        Line::Command(command) => Some(command),
        _ => None,
    })
}

/// The `-A` rules of `text`.
pub fn appended_rules(text: &str) -> impl Iterator<Item = Command<'_>> {
    commands(text).filter(|command| command.op == Op::Append)
}

/// The names of the chains `text` declares (`:NAME ...` lines).
pub fn declared_chains(text: &str) -> impl Iterator<Item = &str> {
    lines(text).filter_map(|line| match line {
        Line::Chain(decl) => Some(decl.name),
        _ => None,
    })
}

/// The `-j` target of a rule spec (or of a whole `-A CHAIN ...` line).
pub fn jump_target(spec: &str) -> Option<Cow<'_, str>> {
    let mut words = tokens(spec);
    while let Some(word) = words.next() {
        if word == "-j" || word == "--jump" {
            return words.next();
        }
    }
    None
}

fn is_space(c: char) -> bool {
    c.is_ascii_whitespace()
}

/// The first word of `text` and what follows it, both without surrounding whitespace.
fn split_word(text: &str) -> (&str, &str) {
    let text = text.trim_start_matches(is_space);
    match text.find(is_space) {
        Some(at) => (&text[..at], text[at..].trim_start_matches(is_space)),
        None => (text, ""),
    }
}

/// Splits rule text into words as iptables-restore does: whitespace separates words; a
/// double-quoted part belongs to the word it is in, with the quotes removed and, inside
/// it, `\` escaping the next character (iptables-save writes `\"` and `\\` so); a closing
/// quote ends the word (so `""` is an empty word). Words are borrowed from `text` unless an
/// escape or a quote in the middle made them differ from it.
pub fn tokens(text: &str) -> Tokens<'_> {
    Tokens { rest: text }
}

/// The iterator of [`tokens`].
#[derive(Clone, Debug)]
pub struct Tokens<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Tokens<'a> {
    type Item = Cow<'a, str>;

    fn next(&mut self) -> Option<Self::Item> {
        let text = self.rest.trim_start_matches(is_space);
        if text.is_empty() {
            self.rest = text;
            return None;
        }
        // The common cases borrow: a word without quotes, or one quoted string without
        // escapes.
        let end = text
            .find(|c: char| is_space(c) || c == '"')
            .unwrap_or(text.len());
        if !text[end..].starts_with('"') {
            self.rest = &text[end..];
            return Some(Cow::Borrowed(&text[..end]));
        }
        if end == 0 {
            let inner = &text[1..];
            if let Some(close) = inner.find(['"', '\\'])
                && inner[close..].starts_with('"')
            {
                self.rest = &inner[close + 1..];
                return Some(Cow::Borrowed(&inner[..close]));
            }
        }
        let mut word = String::new();
        let mut quoted = false;
        let mut chars = text.char_indices();
        while let Some((at, c)) = chars.next() {
            match c {
                '\\' if quoted => {
                    if let Some((_, escaped)) = chars.next() {
                        word.push(escaped);
                    }
                }
                '"' if quoted => {
                    self.rest = &text[at + 1..];
                    return Some(Cow::Owned(word));
                }
                '"' => quoted = true,
                c if is_space(c) && !quoted => {
                    self.rest = &text[at..];
                    return Some(Cow::Owned(word));
                }
                c => word.push(c),
            }
        }
        // An unterminated quote runs to the end of the line.
        self.rest = "";
        Some(Cow::Owned(word))
    }
}

/// One `-A CHAIN ...` rule with its options by name, for readers that ask "what is its
/// `--dport`": a `!` before an option is kept as its prefix (`!-s`), an option without a
/// value maps to "", and when an option repeats the last value wins (`-m comment ... -m
/// tcp` leaves `-m` = "tcp").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub opts: BTreeMap<String, String>,
}

impl Rule {
    /// The rule of an `-A` line; `None` for any other line.
    #[cfg(test)]
    pub fn parse(line: &str) -> Option<Self> {
        match parse_line(line) {
            Line::Command(command) if command.op == Op::Append => Some(Self::of(&command)),
            _ => None,
        }
    }

    /// The options of a command's rule.
    pub fn of(command: &Command<'_>) -> Self {
        let words: Vec<Cow<'_, str>> = command.tokens().collect();
        let mut rule = Self {
            chain: command.chain.to_string(),
            opts: BTreeMap::new(),
        };
        let mut i = 0;
        let mut negate = false;
        while i < words.len() {
            let word = &words[i];
            if word == "!" {
                negate = true;
                i += 1;
                continue;
            }
            if word.starts_with('-') {
                // A word starting with '-' is the next option, unless it is a number.
                let value = words
                    .get(i + 1)
                    .filter(|v| !v.starts_with('-') || v.parse::<f64>().is_ok());
                let key = if negate {
                    format!("!{word}")
                } else {
                    word.to_string()
                };
                match value {
                    Some(value) => {
                        rule.opts.insert(key, value.to_string());
                        i += 2;
                    }
                    None => {
                        rule.opts.insert(key, String::new());
                        i += 1;
                    }
                }
                negate = false;
            } else {
                i += 1;
            }
        }
        rule
    }

    pub fn get(&self, option: &str) -> Option<&str> {
        self.opts.get(option).map(String::as_str)
    }
}

/// The `-A` rules of `text`, with their options.
pub fn rules(text: &str) -> impl Iterator<Item = Rule> + '_ {
    appended_rules(text).map(|command| Rule::of(&command))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        tokens(text).map(Cow::into_owned).collect()
    }

    #[test]
    fn tokens_split_on_whitespace_and_keep_quoted_text_together() {
        assert_eq!(
            words("-m comment --comment \"ns1/svc1:p80 cluster IP\" -j KUBE-SVC-X"),
            [
                "-m",
                "comment",
                "--comment",
                "ns1/svc1:p80 cluster IP",
                "-j",
                "KUBE-SVC-X"
            ]
        );
        assert_eq!(words("  a\t b  "), ["a", "b"]);
        assert!(words("").is_empty() && words("   ").is_empty());
    }

    #[test]
    fn tokens_unescape_inside_quotes_only() {
        assert_eq!(
            words(r#"--comment "say \"hi\" \\ bye" -j X"#),
            ["--comment", r#"say "hi" \ bye"#, "-j", "X"]
        );
        // Outside quotes a backslash is an ordinary character, as for iptables-restore.
        assert_eq!(words(r"a\b c"), [r"a\b", "c"]);
        // A quote in the middle joins; a closing quote ends the word; "" is a word.
        assert_eq!(words(r#"x"y z"w"#), ["xy z", "w"]);
        assert_eq!(words(r#"--comment "" -j X"#), ["--comment", "", "-j", "X"]);
        // An unterminated quote runs to the end.
        assert_eq!(words(r#"--comment "open end"#), ["--comment", "open end"]);
    }

    #[test]
    fn tokens_borrow_when_nothing_was_unquoted_or_unescaped() {
        let mut t = tokens(r#"plain "quoted text" "esc\"aped""#);
        assert!(matches!(t.next(), Some(Cow::Borrowed("plain"))));
        assert!(matches!(t.next(), Some(Cow::Borrowed("quoted text"))));
        assert!(matches!(t.next(), Some(Cow::Owned(w)) if w == "esc\"aped"));
        assert_eq!(t.next(), None);
    }

    #[test]
    fn lines_of_a_saved_table_are_classified() {
        let saved = "# Generated by iptables-save v1.8.9 (nf_tables)\n*nat\n:PREROUTING ACCEPT [12:3456]\n:KUBE-SERVICES - [0:0]\n[5:300] -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A KUBE-SERVICES ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ\n\nCOMMIT\nnonsense here\n";
        let lines: Vec<Line<'_>> = lines(saved).collect();
        assert_eq!(
            lines[0],
            Line::Comment("Generated by iptables-save v1.8.9 (nf_tables)")
        );
        assert_eq!(lines[1], Line::Table("nat"));
        assert_eq!(
            lines[2],
            Line::Chain(ChainDecl {
                name: "PREROUTING",
                policy: "ACCEPT",
                counters: Some(Counters {
                    packets: 12,
                    bytes: 3456
                }),
            })
        );
        assert_eq!(
            lines[3],
            Line::Chain(ChainDecl {
                name: "KUBE-SERVICES",
                policy: "-",
                counters: Some(Counters::default()),
            })
        );
        let Line::Command(jump) = lines[4] else {
            panic!("{:?}", lines[4]);
        };
        assert_eq!(
            (jump.op, jump.chain, jump.counters),
            (
                Op::Append,
                "PREROUTING",
                Some(Counters {
                    packets: 5,
                    bytes: 300
                })
            )
        );
        assert_eq!(
            jump.spec,
            "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
        );
        assert_eq!(jump.target().as_deref(), Some("KUBE-SERVICES"));
        assert!(jump.has_comment("kubernetes service portals"));
        assert!(!jump.has_comment("kubernetes service"));
        assert_eq!(lines[6], Line::Blank);
        assert_eq!(lines[7], Line::Commit);
        assert_eq!(lines[8], Line::Unknown("nonsense here"));
        assert_eq!(
            declared_chains(saved).collect::<Vec<_>>(),
            ["PREROUTING", "KUBE-SERVICES"]
        );
        assert_eq!(appended_rules(saved).count(), 2);
    }

    #[test]
    fn listings_and_restore_commands_are_commands() {
        let listing =
            "-P INPUT ACCEPT\n-N KUBE-FW\n-X KUBE-OLD\n-I INPUT -j KUBE-FW\n-D INPUT -j KUBE-FW\n";
        let ops: Vec<(Op, &str, &str)> =
            commands(listing).map(|c| (c.op, c.chain, c.spec)).collect();
        assert_eq!(
            ops,
            [
                (Op::Policy, "INPUT", "ACCEPT"),
                (Op::NewChain, "KUBE-FW", ""),
                (Op::DeleteChain, "KUBE-OLD", ""),
                (Op::Insert, "INPUT", "-j KUBE-FW"),
                (Op::Delete, "INPUT", "-j KUBE-FW"),
            ]
        );
        assert_eq!(parse_line("-A"), Line::Unknown("-A"));
        assert_eq!(parse_line("-Z CHAIN"), Line::Unknown("-Z CHAIN"));
    }

    #[test]
    fn jump_targets_ignore_quoted_text() {
        assert_eq!(
            jump_target("-m comment --comment \"not -j THIS\" --jump KUBE-A").as_deref(),
            Some("KUBE-A")
        );
        assert_eq!(
            jump_target("-A X -p tcp -j DNAT --to-destination 1.2.3.4:80").as_deref(),
            Some("DNAT")
        );
        assert_eq!(jump_target("-A X -p tcp"), None);
    }

    #[test]
    fn rules_carry_options_negations_and_flags() {
        let rule = Rule::parse(
            "-A KUBE-SVC-X ! -s 10.0.0.0/8 -d 172.30.0.45/32 -p tcp -m comment --comment \"ns/svc:p80 cluster IP\" -m tcp --dport 80 -m recent --rcheck --seconds 10800 --reap -m statistic --mode random --probability 0.5 -m addrtype ! --dst-type LOCAL -j KUBE-MARK-MASQ",
        )
        .unwrap();
        assert_eq!(rule.chain, "KUBE-SVC-X");
        assert_eq!(rule.get("!-s"), Some("10.0.0.0/8"));
        assert_eq!(rule.get("-s"), None);
        assert_eq!(rule.get("-d"), Some("172.30.0.45/32"));
        assert_eq!(rule.get("--comment"), Some("ns/svc:p80 cluster IP"));
        assert_eq!(rule.get("-m"), Some("addrtype"), "the last -m wins");
        assert_eq!(rule.get("--rcheck"), Some(""));
        assert_eq!(rule.get("--reap"), Some(""));
        assert_eq!(rule.get("--seconds"), Some("10800"));
        assert_eq!(rule.get("--probability"), Some("0.5"));
        assert_eq!(rule.get("!--dst-type"), Some("LOCAL"));
        assert_eq!(rule.get("-j"), Some("KUBE-MARK-MASQ"));
        // A negative number is a value, not an option.
        let negative = Rule::parse("-A X --offset -1 -j Y").unwrap();
        assert_eq!(negative.get("--offset"), Some("-1"));
        assert!(Rule::parse("-I X -j Y").is_none() && Rule::parse(":X - [0:0]").is_none());
        let saved = "*filter\n:KUBE-A - [0:0]\n-A KUBE-A -j DROP\n-A KUBE-B -j REJECT\nCOMMIT\n";
        let chains: Vec<String> = rules(saved).map(|r| r.chain).collect();
        assert_eq!(chains, ["KUBE-A", "KUBE-B"]);
    }
}
