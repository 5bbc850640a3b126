// SPDX-License-Identifier: Apache-2.0
//! Import cycles between the files of a crate: which file's `use` declarations name an item
//! of which other file, and the groups of files that reach each other that way.
//!
//! A file is a layer: a cycle means two files can only be understood (and changed)
//! together. The check reads the source, not the compiler's view, so it is small and fast:
//! the module tree is followed from each crate root through `mod name;` declarations
//! (`#[path]` and inline `mod name { .. }` blocks included), and every path that starts
//! with `crate::`, `super::` or `self::` (in a `use` declaration or written out in the
//! code), and every `use` of a child module by its bare name, is resolved to the deepest
//! module it names. When the path goes on to an item that the module itself only imports
//! (`use`, `pub use`), the import is followed, so a file that takes a type through its
//! parent's re-export depends on the file that defines it, not on the parent.
//!
//! A module's own file reaching down into its submodules (declaring, re-exporting or
//! calling them) is not counted: the parent is its children's facade, and the children may
//! use what it defines. Everything else is: siblings, cousins, a child and an ancestor's
//! file that is not its parent's facade, like a `#[path]` test file.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// One `use` path of a file, expanded from its use tree.
#[derive(Debug, Clone)]
struct UsePath {
    /// The module the declaration is in.
    module: ModuleId,
    /// The module of the file the declaration is in (`module` without inline modules).
    file_module: Vec<String>,
    /// The path's segments as written (`crate`, `super`, `self` included).
    segments: Vec<String>,
    /// The name the path is imported as (the last segment, or the `as` alias; none for a
    /// glob, `as _`, or a path in the code).
    name: Option<String>,
    line: usize,
}

/// A module: the crate root it belongs to (a crate's lib, main, each bin, test, bench or
/// example root is a crate of its own) and its path below that root.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ModuleId {
    root: usize,
    path: Vec<String>,
}

/// One import of a file from another file, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub from: PathBuf,
    pub to: PathBuf,
    pub line: usize,
    /// The path as written, e.g. `crate::maps::FIB_SCRATCH`.
    pub path: String,
}

/// A group of files that all reach each other through imports (a strongly connected
/// component of more than one file), with the imports between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    pub files: Vec<PathBuf>,
    pub imports: Vec<Import>,
}

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
        writeln!(f, "cycle between {}:", names.join(", "))?;
        for import in &self.imports {
            writeln!(
                f,
                "    {}:{} -> {}  ({})",
                import.from.display(),
                import.line,
                import.to.display(),
                import.path
            )?;
        }
        Ok(())
    }
}

/// The import cycles of the crate in `crate_dir` (its `src/`, `tests/`, `benches/` and
/// `examples/` roots), file paths relative to `crate_dir`.
pub fn check_crate_dir(crate_dir: &Path) -> std::io::Result<Vec<Cycle>> {
    let mut files = BTreeMap::new();
    for dir in ["src", "tests", "benches", "examples"] {
        collect_rs_files(crate_dir, &crate_dir.join(dir), &mut files)?;
    }
    let roots = crate_roots(&files);
    Ok(find_cycles(&files, &roots))
}

fn collect_rs_files(
    base: &Path,
    dir: &Path,
    files: &mut BTreeMap<PathBuf, String>,
) -> std::io::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            collect_rs_files(base, &path, files)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path)?;
            let rel = path.strip_prefix(base).unwrap_or(&path).to_path_buf();
            files.insert(rel, text);
        }
    }
    Ok(())
}

/// Cargo's crate roots among `files`: src/lib.rs, src/main.rs, src/bin/*.rs (or
/// src/bin/*/main.rs), and the files directly in tests/, benches/ and examples/.
fn crate_roots(files: &BTreeMap<PathBuf, String>) -> Vec<PathBuf> {
    files
        .keys()
        .filter(|p| {
            let parts: Vec<&str> = p.iter().filter_map(|s| s.to_str()).collect();
            matches!(
                parts.as_slice(),
                ["src", "lib.rs" | "main.rs"]
                    | ["src", "bin", _]
                    | ["src", "bin", _, "main.rs"]
                    | ["tests" | "benches" | "examples", _]
            )
        })
        .cloned()
        .collect()
}

/// The cycles of the module trees rooted at `roots`, over the sources in `files`.
pub fn find_cycles(files: &BTreeMap<PathBuf, String>, roots: &[PathBuf]) -> Vec<Cycle> {
    let tree = ModuleTree::build(files, roots);
    let imports = tree.imports();
    cycles(&imports)
}

struct ModuleTree {
    /// Every module and the file it is written in (inline modules: their file).
    modules: BTreeMap<ModuleId, PathBuf>,
    uses: Vec<(PathBuf, UsePath)>,
}

impl ModuleTree {
    fn build(files: &BTreeMap<PathBuf, String>, roots: &[PathBuf]) -> ModuleTree {
        let mut tree = ModuleTree {
            modules: BTreeMap::new(),
            uses: Vec::new(),
        };
        for (root_index, root) in roots.iter().enumerate() {
            let mut pending = vec![(
                ModuleId {
                    root: root_index,
                    path: Vec::new(),
                },
                root.clone(),
            )];
            while let Some((module, file)) = pending.pop() {
                let Some(text) = files.get(&file) else {
                    continue;
                };
                if tree.modules.contains_key(&module) {
                    continue;
                }
                tree.modules.insert(module.clone(), file.clone());
                let parsed = parse_file(text);
                for inline in &parsed.inline_modules {
                    let mut path = module.path.clone();
                    path.extend(inline.iter().cloned());
                    tree.modules.insert(
                        ModuleId {
                            root: root_index,
                            path,
                        },
                        file.clone(),
                    );
                }
                for decl in parsed.file_modules {
                    let mut path = module.path.clone();
                    path.extend(decl.within.iter().cloned());
                    path.push(decl.name.clone());
                    let child = ModuleId {
                        root: root_index,
                        path,
                    };
                    if let Some(child_file) = child_file(&file, &decl, files) {
                        pending.push((child, child_file));
                    }
                }
                for parsed_use in parsed.uses {
                    let mut path = module.path.clone();
                    path.extend(parsed_use.within.iter().cloned());
                    tree.uses.push((
                        file.clone(),
                        UsePath {
                            module: ModuleId {
                                root: root_index,
                                path,
                            },
                            file_module: module.path.clone(),
                            segments: parsed_use.segments,
                            name: parsed_use.name,
                            line: parsed_use.line,
                        },
                    ));
                }
            }
        }
        tree
    }

    fn is_module(&self, root: usize, path: &[String]) -> bool {
        self.modules.contains_key(&ModuleId {
            root,
            path: path.to_vec(),
        })
    }

    /// The module a use path names (its deepest module), following imports of the item it
    /// goes on to; `None` for paths outside the crate.
    fn resolve(&self, use_path: &UsePath, depth: usize) -> Option<ModuleId> {
        let root = use_path.module.root;
        let segments = &use_path.segments;
        let mut base = use_path.module.path.clone();
        let mut rest = segments.as_slice();
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                let mut child = base.clone();
                child.push(first.to_string());
                if !self.is_module(root, &child) {
                    return None; // another crate, std, or a local item
                }
            }
            None => return None,
        }
        let mut current = base;
        while let Some(segment) = rest.first() {
            if segment == "self" {
                rest = &rest[1..];
                continue;
            }
            if segment == "super" {
                current.pop()?;
                rest = &rest[1..];
                continue;
            }
            let mut next = current.clone();
            next.push(segment.clone());
            if !self.is_module(root, &next) {
                break;
            }
            current = next;
            rest = &rest[1..];
        }
        let module = ModuleId {
            root,
            path: current,
        };
        // An item the module only imports: follow the import (bounded, imports may loop).
        if let Some(item) = rest.first()
            && depth < 8
            && let Some(import) = self
                .uses
                .iter()
                .map(|(_, u)| u)
                .find(|u| u.module == module && u.name.as_deref() == Some(item.as_str()))
            && let Some(target) = self.resolve(import, depth + 1)
        {
            return Some(target);
        }
        Some(module)
    }

    /// The imports from one file of the crate to another.
    fn imports(&self) -> Vec<Import> {
        let mut imports = Vec::new();
        for (from, use_path) in &self.uses {
            let Some(target) = self.resolve(use_path, 0) else {
                continue;
            };
            let Some(to) = self.modules.get(&target) else {
                continue;
            };
            let downward = target.path.len() > use_path.file_module.len()
                && target.path.starts_with(&use_path.file_module);
            if to != from && !downward {
                imports.push(Import {
                    from: from.clone(),
                    to: to.clone(),
                    line: use_path.line,
                    path: use_path.segments.join("::"),
                });
            }
        }
        imports
    }
}

/// The file a `mod name;` declaration of `file` loads.
fn child_file(file: &Path, decl: &ModDecl, files: &BTreeMap<PathBuf, String>) -> Option<PathBuf> {
    let dir = file.parent().unwrap_or(Path::new(""));
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    // A file that owns its directory (mod.rs or a crate root) has its children beside it;
    // any other file `a.rs` has them in `a/`.
    let owns_dir = stem == "mod" || crate_roots_contains(file);
    if let Some(path) = &decl.path_attr {
        // `#[path]` on a declaration in a file is relative to the file's directory, in an
        // inline module to that module's directory.
        let mut base = dir.to_path_buf();
        if !decl.within.is_empty() {
            if !owns_dir {
                base.push(stem);
            }
            base.extend(decl.within.iter());
        }
        return Some(normalize(&base.join(path)));
    }
    let mut base = dir.to_path_buf();
    if !owns_dir {
        base.push(stem);
    }
    base.extend(decl.within.iter());
    let flat = base.join(format!("{}.rs", decl.name));
    if files.contains_key(&flat) {
        return Some(flat);
    }
    let nested = base.join(&decl.name).join("mod.rs");
    files.contains_key(&nested).then_some(nested)
}

/// Whether `file` is a crate root by its place (see [`crate_roots`]); a root owns its
/// directory the way mod.rs does.
fn crate_roots_contains(file: &Path) -> bool {
    let mut one = BTreeMap::new();
    one.insert(file.to_path_buf(), String::new());
    !crate_roots(&one).is_empty()
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The strongly connected components of more than one file (Tarjan), each with the
/// imports inside it; sorted by their first file.
fn cycles(imports: &[Import]) -> Vec<Cycle> {
    let mut nodes: BTreeSet<&Path> = BTreeSet::new();
    for import in imports {
        nodes.insert(&import.from);
        nodes.insert(&import.to);
    }
    let nodes: Vec<&Path> = nodes.into_iter().collect();
    let index_of = |p: &Path| nodes.binary_search(&p).ok();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); nodes.len()];
    for import in imports {
        if let (Some(a), Some(b)) = (index_of(&import.from), index_of(&import.to)) {
            edges[a].insert(b);
        }
    }
    let components = strongly_connected(&edges);
    let mut found: Vec<Cycle> = components
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|component| {
            let members: BTreeSet<&Path> = component.iter().map(|&i| nodes[i]).collect();
            let files: Vec<PathBuf> = members.iter().map(|p| p.to_path_buf()).collect();
            let mut inner: Vec<Import> = imports
                .iter()
                .filter(|i| members.contains(i.from.as_path()) && members.contains(i.to.as_path()))
                .cloned()
                .collect();
            inner.sort_by(|a, b| (&a.from, a.line).cmp(&(&b.from, b.line)));
            Cycle {
                files,
                imports: inner,
            }
        })
        .collect();
    found.sort_by(|a, b| a.files.cmp(&b.files));
    found
}

/// Tarjan's algorithm, iterative (no recursion depth limit on large crates).
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    let n = edges.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next_index = 0;
    let mut components = Vec::new();
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        // (node, its successors not yet visited)
        let mut work: Vec<(usize, Vec<usize>)> = Vec::new();
        index[start] = next_index;
        low[start] = next_index;
        next_index += 1;
        stack.push(start);
        on_stack[start] = true;
        work.push((start, edges[start].iter().rev().copied().collect()));
        while let Some((node, successors)) = work.last_mut() {
            let node = *node;
            if let Some(next) = successors.pop() {
                if index[next] == usize::MAX {
                    index[next] = next_index;
                    low[next] = next_index;
                    next_index += 1;
                    stack.push(next);
                    on_stack[next] = true;
                    work.push((next, edges[next].iter().rev().copied().collect()));
                } else if on_stack[next] {
                    low[node] = low[node].min(index[next]);
                }
                continue;
            }
            work.pop();
            if let Some((parent, _)) = work.last() {
                low[*parent] = low[*parent].min(low[node]);
            }
            if low[node] == index[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

// --- Reading a file: a tokenizer that knows comments, strings and lifetimes, and a parser
// --- for the few item forms the check needs.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Str(String),
    Punct(char),
}

/// Tokens with their line numbers; comments dropped, literals other than strings dropped.
fn tokenize(text: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if let Some((value, end, lines)) = string_literal(&chars, i) {
            tokens.push((Token::Str(value), line));
            line += lines;
            i = end;
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{..}') or a lifetime ('a): skip either.
            if next == Some('\\') {
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // Raw identifiers: r#type is the identifier `type`.
            if word == "r" && chars.get(i) == Some(&'#') {
                i += 1;
                continue;
            }
            tokens.push((Token::Ident(word), line));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else {
            tokens.push((Token::Punct(c), line));
            i += 1;
        }
    }
    tokens
}

/// A string literal at `i` ("..", r".." / r#".."#, b"..", br".."): its value, the index
/// after it and the newlines in it.
fn string_literal(chars: &[char], i: usize) -> Option<(String, usize, usize)> {
    let mut j = i;
    if chars.get(j) == Some(&'b') || chars.get(j) == Some(&'c') {
        j += 1;
    }
    let raw = chars.get(j) == Some(&'r');
    if raw {
        j += 1;
    }
    let mut hashes = 0;
    while raw && chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"') {
        return None;
    }
    // A prefix must not be the end of an identifier (`abr"` is not a raw string).
    if j > i && i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    j += 1;
    let mut value = String::new();
    let mut lines = 0;
    while j < chars.len() {
        let c = chars[j];
        if c == '\n' {
            lines += 1;
        }
        if !raw && c == '\\' {
            if let Some(&escaped) = chars.get(j + 1) {
                if escaped == '\n' {
                    lines += 1;
                }
                value.push(escaped);
            }
            j += 2;
            continue;
        }
        if c == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
            return Some((value, j + 1 + hashes, lines));
        }
        value.push(c);
        j += 1;
    }
    Some((value, j, lines))
}

/// A `mod name;` declaration: inside which inline modules of the file, and its `#[path]`.
#[derive(Debug)]
struct ModDecl {
    within: Vec<String>,
    name: String,
    path_attr: Option<String>,
}

#[derive(Debug)]
struct ParsedUse {
    within: Vec<String>,
    segments: Vec<String>,
    name: Option<String>,
    line: usize,
}

#[derive(Debug, Default)]
struct ParsedFile {
    file_modules: Vec<ModDecl>,
    /// Inline modules, as paths below the file's module.
    inline_modules: Vec<Vec<String>>,
    uses: Vec<ParsedUse>,
}

fn parse_file(text: &str) -> ParsedFile {
    let tokens = tokenize(text);
    let mut parsed = ParsedFile::default();
    // The inline modules we are in, each with the brace depth its body opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut path_attr: Option<String> = None;
    let mut i = 0;
    let ident = |k: usize| match tokens.get(k) {
        Some((Token::Ident(s), _)) => Some(s.as_str()),
        _ => None,
    };
    let punct = |k: usize, c: char| matches!(tokens.get(k), Some((Token::Punct(p), _)) if *p == c);
    while i < tokens.len() {
        let within = || inline.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        match &tokens[i].0 {
            Token::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Token::Punct('}') => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth + 1) {
                    inline.pop();
                }
                i += 1;
            }
            // #[path = "file.rs"]
            Token::Punct('#')
                if punct(i + 1, '[')
                    && ident(i + 2) == Some("path")
                    && punct(i + 3, '=')
                    && punct(i + 5, ']') =>
            {
                if let Some((Token::Str(s), _)) = tokens.get(i + 4) {
                    path_attr = Some(s.clone());
                }
                i += 6;
            }
            Token::Ident(word) if word == "mod" => {
                // `mod` after `.` or `::` is a field or path segment, not an item.
                let after_path = i > 0 && (punct(i - 1, '.') || punct(i - 1, ':'));
                match (ident(i + 1), after_path) {
                    (Some(name), false) if punct(i + 2, ';') => {
                        parsed.file_modules.push(ModDecl {
                            within: within(),
                            name: name.to_string(),
                            path_attr: path_attr.take(),
                        });
                        i += 3;
                    }
                    (Some(name), false) if punct(i + 2, '{') => {
                        let mut path = within();
                        path.push(name.to_string());
                        parsed.inline_modules.push(path);
                        depth += 1;
                        inline.push((name.to_string(), depth));
                        path_attr = None;
                        i += 3;
                    }
                    _ => i += 1,
                }
            }
            Token::Ident(word) if word == "use" => {
                let after_path = i > 0 && (punct(i - 1, '.') || punct(i - 1, ':'));
                if after_path {
                    i += 1;
                    continue;
                }
                let line = tokens[i].1;
                let mut j = i + 1;
                let mut trees = Vec::new();
                parse_use_tree(&tokens, &mut j, Vec::new(), &mut trees);
                for (segments, name) in trees {
                    parsed.uses.push(ParsedUse {
                        within: within(),
                        segments,
                        name,
                        line,
                    });
                }
                // Up to the end of the declaration.
                while j < tokens.len() && !punct(j, ';') {
                    j += 1;
                }
                i = j;
            }
            Token::Punct(';') => {
                path_attr = None;
                i += 1;
            }
            // A path in the code: `crate::a::f()`, `super::B { .. }`; not the middle of a
            // longer path, nor a visibility (`pub(in crate::a)`).
            Token::Ident(word)
                if matches!(word.as_str(), "crate" | "super" | "self")
                    && punct(i + 1, ':')
                    && punct(i + 2, ':')
                    && !(i > 0 && punct(i - 1, ':'))
                    && !(i > 0 && ident(i - 1) == Some("in")) =>
            {
                let line = tokens[i].1;
                let mut segments = vec![word.clone()];
                let mut j = i + 1;
                while punct(j, ':') && punct(j + 1, ':') {
                    let Some(segment) = ident(j + 2) else {
                        break;
                    };
                    segments.push(segment.to_string());
                    j += 3;
                }
                parsed.uses.push(ParsedUse {
                    within: within(),
                    segments,
                    name: None,
                    line,
                });
                i = j;
            }
            _ => i += 1,
        }
    }
    parsed
}

/// Parses one use tree at `*k` with the path `prefix` before it, pushing every path it
/// expands to with the name it is imported as.
fn parse_use_tree(
    tokens: &[(Token, usize)],
    k: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix;
    // A leading `::` names an external crate: nothing of this crate.
    let is_colon = |k: usize| matches!(tokens.get(k), Some((Token::Punct(':'), _)));
    if is_colon(*k) && is_colon(*k + 1) {
        return;
    }
    loop {
        match tokens.get(*k).map(|(t, _)| t) {
            Some(Token::Ident(segment)) => {
                path.push(segment.clone());
                *k += 1;
                if is_colon(*k) && is_colon(*k + 1) {
                    *k += 2;
                    continue;
                }
                // The end of this path: `as alias`?
                let mut name = path.last().cloned();
                if name.as_deref() == Some("self") {
                    path.pop();
                    name = path.last().cloned();
                }
                if matches!(tokens.get(*k), Some((Token::Ident(w), _)) if w == "as") {
                    name = match tokens.get(*k + 1) {
                        Some((Token::Ident(alias), _)) => Some(alias.clone()),
                        _ => None,
                    };
                    *k += 2;
                }
                out.push((path, name));
                return;
            }
            Some(Token::Punct('*')) => {
                *k += 1;
                out.push((path, None));
                return;
            }
            Some(Token::Punct('{')) => {
                *k += 1;
                loop {
                    match tokens.get(*k).map(|(t, _)| t) {
                        Some(Token::Punct('}')) => {
                            *k += 1;
                            return;
                        }
                        Some(Token::Punct(',')) => *k += 1,
                        None => return,
                        Some(_) => {
                            let before = *k;
                            parse_use_tree(tokens, k, path.clone(), out);
                            if *k == before {
                                *k += 1; // not a use tree: skip the token
                            }
                        }
                    }
                }
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
        files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect()
    }

    fn cycles_of(files: &[(&str, &str)]) -> Vec<Vec<String>> {
        let files = tree(files);
        let roots = crate_roots(&files);
        find_cycles(&files, &roots)
            .into_iter()
            .map(|c| c.files.iter().map(|p| p.display().to_string()).collect())
            .collect()
    }

    #[test]
    fn use_trees_expand_to_paths_with_their_names() {
        let parsed = parse_file(
            "pub(crate) use crate::{a::{self, B as C}, d::*, e::f::G};\nuse std::io;\nuse ::x::y;",
        );
        let got: Vec<(String, Option<String>)> = parsed
            .uses
            .iter()
            .map(|u| (u.segments.join("::"), u.name.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("crate::a".into(), Some("a".into())),
                ("crate::a::B".into(), Some("C".into())),
                ("crate::d".into(), None),
                ("crate::e::f::G".into(), Some("G".into())),
                ("std::io".into(), Some("io".into())),
            ]
        );
    }

    #[test]
    fn comments_strings_and_lifetimes_hide_nothing_and_invent_nothing() {
        let parsed = parse_file(
            "// use crate::a;\n/* use crate::b; /* nested */ */\nconst S: &str = \"use crate::c;\";\n\
             fn f<'a>(x: &'a u8) -> char { 'u' }\nconst R: &str = r#\"mod d;\"#;\nuse crate::e;\n",
        );
        assert_eq!(parsed.uses.len(), 1);
        assert_eq!(parsed.uses[0].segments.join("::"), "crate::e");
        assert_eq!(parsed.uses[0].line, 6);
        assert!(parsed.file_modules.is_empty());
    }

    #[test]
    fn a_two_file_cycle_is_found_with_its_lines() {
        let files = tree(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
            ("src/b.rs", "\nuse crate::a::A;\npub struct B;\n"),
        ]);
        let found = find_cycles(&files, &crate_roots(&files));
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].files,
            vec![PathBuf::from("src/a.rs"), PathBuf::from("src/b.rs")]
        );
        let lines: Vec<(String, usize)> = found[0]
            .imports
            .iter()
            .map(|i| (i.from.display().to_string(), i.line))
            .collect();
        assert_eq!(
            lines,
            vec![("src/a.rs".to_string(), 1), ("src/b.rs".to_string(), 2)]
        );
        assert!(
            found[0]
                .to_string()
                .contains("src/b.rs:2 -> src/a.rs  (crate::a::A)")
        );
    }

    #[test]
    fn layers_without_a_cycle_pass() {
        let found = cycles_of(&[
            ("src/main.rs", "mod a;\nmod b;\nmod c;\nuse crate::a::A;\n"),
            ("src/a.rs", "use crate::b::B;\nuse crate::c::C;\n"),
            (
                "src/b.rs",
                "use crate::c::C;\nuse std::collections::HashMap;\n",
            ),
            (
                "src/c.rs",
                "pub struct C;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
            ),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn super_self_and_paths_in_the_code_resolve_to_files() {
        // net/parse.rs -> net/io.rs (self::super::), net/io.rs -> net/parse.rs (a path in
        // an expression).
        let found = cycles_of(&[
            ("src/lib.rs", "pub mod net;\n"),
            ("src/net/mod.rs", "pub mod io;\npub mod parse;\n"),
            (
                "src/net/io.rs",
                "pub trait Io {}\nfn f() { let _ = super::parse::len::<u8>(); }\n",
            ),
            (
                "src/net/parse.rs",
                "use self::super::io::Io;\npub fn len<T>() {}\n",
            ),
        ]);
        assert_eq!(found, vec![vec!["src/net/io.rs", "src/net/parse.rs"]]);
    }

    #[test]
    fn a_parent_reaching_into_its_children_is_no_cycle() {
        // mod.rs defines what its children use and uses them (bare names, self::, crate::
        // paths in code); the children use super::. Only the parent reaches down.
        let found = cycles_of(&[
            ("src/lib.rs", "pub mod net;\nuse crate::net::io::Io;\n"),
            (
                "src/net/mod.rs",
                "pub mod io;\npub mod deep;\nuse io::Io;\nuse self::deep::leaf::L;\n\
                 pub trait Family {}\nfn f() { crate::net::io::g(); }\n",
            ),
            (
                "src/net/io.rs",
                "use super::Family;\npub trait Io {}\npub fn g() {}\n",
            ),
            ("src/net/deep/mod.rs", "pub mod leaf;\n"),
            (
                "src/net/deep/leaf.rs",
                "use crate::net::Family;\npub struct L;\n",
            ),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn visibilities_and_the_middle_of_paths_are_no_paths() {
        let parsed = parse_file(
            "pub(in crate::a) fn f() {}\npub(super) fn g() {}\nfn h() { x::crate::y(); }\n",
        );
        assert!(parsed.uses.is_empty(), "{:?}", parsed.uses);
    }

    #[test]
    fn a_re_export_is_followed_to_the_file_that_defines_the_item() {
        // a/x.rs takes Y through a/mod.rs's re-export: it depends on a/y.rs, not on a/mod.rs,
        // so a/mod.rs re-exporting x is no cycle.
        let found = cycles_of(&[
            ("src/lib.rs", "mod a;\n"),
            (
                "src/a/mod.rs",
                "mod x;\nmod y;\npub use x::X;\npub use y::Y;\n",
            ),
            ("src/a/x.rs", "use super::Y;\npub struct X;\n"),
            ("src/a/y.rs", "pub struct Y;\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_longer_cycle_through_nested_modules_is_one_group() {
        // The shape of proxy-ebpf's old maps.rs <-> nodeport/parse.rs cycle.
        let found = cycles_of(&[
            ("src/main.rs", "mod maps;\nmod nodeport;\n"),
            (
                "src/maps.rs",
                "use crate::nodeport::parse::Packet;\npub static FIB: u8 = 0;\n",
            ),
            ("src/nodeport/mod.rs", "pub mod io;\npub mod parse;\n"),
            (
                "src/nodeport/parse.rs",
                "use super::io::PacketIo;\npub struct Packet;\n",
            ),
            (
                "src/nodeport/io.rs",
                "use crate::maps::FIB;\npub trait PacketIo {}\n",
            ),
        ]);
        assert_eq!(
            found,
            vec![vec![
                "src/maps.rs",
                "src/nodeport/io.rs",
                "src/nodeport/parse.rs"
            ]]
        );
    }

    #[test]
    fn path_attributes_and_inline_modules_are_followed() {
        // validate.rs loads validate_tests.rs through #[path]; the inline module's
        // `super::` is validate.rs itself.
        let found = cycles_of(&[
            ("src/lib.rs", "mod config;\n"),
            ("src/config/mod.rs", "mod validate;\nmod typed;\n"),
            (
                "src/config/validate.rs",
                "use super::typed::T;\n#[cfg(test)]\n#[path = \"validate_tests.rs\"]\nmod tests;\n\
                 mod inner {\n    use super::super::typed::T;\n}\n",
            ),
            (
                "src/config/validate_tests.rs",
                "use super::*;\nuse crate::config::typed::T;\n",
            ),
            (
                "src/config/typed.rs",
                "pub struct T;\nuse crate::config::validate::tests::X;\n",
            ),
        ]);
        assert_eq!(
            found,
            vec![vec![
                "src/config/typed.rs",
                "src/config/validate.rs",
                "src/config/validate_tests.rs"
            ]]
        );
    }

    #[test]
    fn separate_crate_roots_do_not_mix() {
        // main.rs's `crate::` is the binary, not the library.
        let found = cycles_of(&[
            ("src/lib.rs", "pub mod a;\npub mod b;\n"),
            ("src/a.rs", "use crate::b::B;\n"),
            ("src/b.rs", "pub struct B;\n"),
            ("src/main.rs", "mod b;\nuse crate::b::B;\n"),
            ("tests/it.rs", "mod common;\nuse common::C;\n"),
            ("tests/common/mod.rs", "pub struct C;\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }
}
