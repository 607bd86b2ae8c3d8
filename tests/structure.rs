//! The source tree's shape (docs/architecture.md), checked so that it cannot drift back:
//!
//! * no file of the library (`src/`) is over [`MAX_SRC_LINES`] lines, nor any of the command line's (`cli/src/`);
//! * no import circle between the library's files: a `use` (or a `crate::…` / `super::…` path) of one file's items
//!   by another is an edge, and the edges form no cycle. A module's own items reaching into its submodules (a
//!   `mod.rs` re-exporting its children) is structure, not an import, and is not an edge;
//! * the leadership runtime (`src/leader/`) reaches the store only through [`Store`](pgfence::Store) and the
//!   narrow `store::statement` API;
//! * no test function (`#[test]`, `#[tokio::test]`) in `tests/` is over [`MAX_TEST_LINES`] lines.
//!
//! Each rule was first run against the tree it was written for and caught what it forbids there (a 1,552-line
//! file, the command line's six files over the limit, the circle between `leader/held.rs` and
//! `leader/supervisor.rs`, the leader's use of the store's internals, a 256-line test); the unit tests at the end
//! feed each checker a small tree that breaks its rule.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a file of the library, or of the command line, may have.
const MAX_SRC_LINES: usize = 700;
/// The most lines a test function may have, from its `fn` line to its closing brace.
const MAX_TEST_LINES: usize = 120;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, sorted, as (path relative to `base`, text).
fn rust_files(dir: &Path, base: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(base)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                out.push((rel, fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// The module path of a library file (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `src/lib.rs` is the root).
fn module_of(rel: &str) -> Vec<String> {
    let inner = rel
        .strip_prefix("src/")
        .unwrap_or(rel)
        .trim_end_matches(".rs");
    let mut parts: Vec<String> = inner.split('/').map(str::to_owned).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod") | Some("lib") | Some("main")
    ) {
        parts.pop();
    }
    parts
}

/// The text with comments, string and character literals blanked out (lengths and line breaks kept), so that
/// braces and paths inside them count for nothing.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !ident_char(b.get(i.wrapping_sub(1)))
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &b[i..j.min(b.len())] {
                out.push(blank(ch));
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') — not a lifetime ('a without a closing quote).
            let close = if next == Some('\\') {
                (i + 2..b.len().min(i + 12)).find(|&k| b[k] == '\'')
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(k) => {
                    for _ in i..=k {
                        out.push(' ');
                    }
                    i = k + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// Expands one `use` tree (`a::{b, c::{d, e}}`) into its full paths.
fn expand_use(tree: &str) -> Vec<String> {
    // `x as y` names x: drop the alias before the spaces go.
    let words: Vec<&str> = tree.split_whitespace().collect();
    let mut kept = String::new();
    let mut k = 0;
    while k < words.len() {
        if words[k] == "as" && k + 1 < words.len() {
            let alias = words[k + 1];
            kept.push_str(&alias[alias.find([',', '}']).unwrap_or(alias.len())..]);
            k += 2;
        } else {
            kept.push_str(words[k]);
            k += 1;
        }
    }
    let tree = kept;
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let body = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, ch) in body.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            expand_use(p)
                .into_iter()
                .map(move |s| format!("{prefix}{s}"))
        })
        .collect()
}

/// The paths a file names: its `use` items (expanded) and every `crate::…` path in its code. A `use super::…`
/// indented under an inline module (`mod tests { use super::*; }`) names the file itself and is left out.
fn named_paths(code: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(k) = find_word(rest, "use") {
        let line_start = rest[..k].rfind('\n').map_or(0, |n| n + 1);
        let prefix = &rest[line_start..k];
        // Unindented: an item of the file itself, not of an inline module inside it.
        let top_level = prefix.is_empty() || prefix.starts_with("pub");
        let end = rest[k..].find(';').map_or(rest.len(), |e| k + e);
        for path in expand_use(&rest[k + 3..end]) {
            out.push((path, top_level));
        }
        rest = &rest[end.min(rest.len())..];
        if rest.is_empty() {
            break;
        }
        rest = &rest[1..];
    }
    // Paths written out in the code (`crate::a::B`, `super::a::B` in a signature or a body). A `super::` or
    // `self::` inside an inline module (`mod tests { … }`) is relative to that module, so those are left out.
    let outside = without_inline_modules(code);
    for (root, text) in [
        ("crate::", code),
        ("super::", outside.as_str()),
        ("self::", outside.as_str()),
    ] {
        let mut at = 0;
        while let Some(k) = text[at..].find(root) {
            let s = at + k;
            let before = text[..s].chars().last();
            if !ident_char(before.as_ref()) && before != Some(':') {
                let path: String = text[s..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                out.push((path, true));
            }
            at = s + root.len();
        }
    }
    out
}

/// The code with the bodies of its inline modules (`mod name { … }`) blanked out.
fn without_inline_modules(code: &str) -> String {
    let mut out: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < out.len() {
        let rest: String = out[i..out.len().min(i + 4)].iter().collect();
        let before = if i == 0 { None } else { Some(out[i - 1]) };
        if rest == "mod " && !ident_char(before.as_ref()) {
            let mut j = i + 4;
            while j < out.len() && (out[j].is_alphanumeric() || out[j] == '_' || out[j] == ' ') {
                j += 1;
            }
            if j < out.len() && out[j] == '{' {
                let mut depth = 0;
                while j < out.len() {
                    match out[j] {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    if out[j] != '\n' {
                        out[j] = ' ';
                    }
                    j += 1;
                    if depth == 0 {
                        break;
                    }
                }
                i = j;
                continue;
            }
        }
        i += 1;
    }
    out.into_iter().collect()
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut at = 0;
    while let Some(k) = text[at..].find(word) {
        let s = at + k;
        let before = text[..s].chars().last();
        let after = text[s + word.len()..].chars().next();
        if !ident_char(before.as_ref()) && after.is_some_and(char::is_whitespace) {
            return Some(s);
        }
        at = s + word.len();
    }
    None
}

/// The library file a path names, seen from the file `from` (its module path): the longest module prefix of the
/// path that is a file. `None` for paths outside the crate (`std::…`, `diesel::…`).
fn resolve(path: &str, from: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<String> = match segs.first() {
        Some(&"crate") => Vec::new(),
        Some(&"super") | Some(&"self") => {
            // `self` in a file is the file's module; `super` its parent (a `mod.rs` is its directory's module).
            let mut m = from.to_vec();
            if segs[0] == "super" {
                m.pop();
            }
            m
        }
        _ => return None,
    };
    let mut k = 1;
    while segs.get(k) == Some(&"super") {
        base.pop();
        k += 1;
    }
    let mut best = base.clone();
    for s in &segs[k..] {
        base.push((*s).to_owned());
        if modules.contains(&base) {
            best = base.clone();
        } else {
            break;
        }
    }
    Some(best)
}

/// The import edges between the library's files: `from` names an item of `to`, `to` is not `from` nor inside it.
fn import_edges(files: &[(String, String)]) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(p, _)| module_of(p)).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (rel, text) in files {
        let from = module_of(rel);
        for (path, top_level) in named_paths(&code_only(text)) {
            if !top_level && (path.starts_with("super::") || path.starts_with("self::")) {
                continue;
            }
            if let Some(to) = resolve(&path, &from, &modules) {
                if to != from && !to.starts_with(&from) {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    edges
}

/// One cycle of the graph, if there is one (as the files along it).
fn a_cycle(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        state.insert(node.clone(), 1);
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(next, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if state.get(node).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(node, edges, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Every edge that lies on some circle (its target reaches back to its source).
fn edges_on_circles(
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Vec<(Vec<String>, Vec<String>)> {
    let reaches = |from: &Vec<String>, to: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            if &n == to {
                return true;
            }
            if seen.insert(n.clone()) {
                stack.extend(edges.get(&n).into_iter().flatten().cloned());
            }
        }
        false
    };
    let mut out = Vec::new();
    for (a, targets) in edges {
        for b in targets {
            if reaches(b, a) {
                out.push((a.clone(), b.clone()));
            }
        }
    }
    out
}

fn show(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

/// The test functions of a file over `max` lines, as (name, first line, lines).
fn long_tests(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim_start();
        if t.starts_with("#[test]") || t.starts_with("#[tokio::test") {
            let Some(f) = (i..lines.len()).find(|&k| find_word(lines[k], "fn").is_some()) else {
                break;
            };
            let name: String = lines[f][find_word(lines[f], "fn").unwrap() + 2..]
                .trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let mut depth = 0i64;
            let mut opened = false;
            let mut end = f;
            'scan: for (k, line) in lines.iter().enumerate().skip(f) {
                for ch in line.chars() {
                    match ch {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => {
                            depth -= 1;
                            if opened && depth == 0 {
                                end = k;
                                break 'scan;
                            }
                        }
                        _ => {}
                    }
                }
            }
            let len = end - f + 1;
            if len > max {
                out.push((name, f + 1, len));
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The Rust files under `dir` (from the repository root) over [`MAX_SRC_LINES`] lines, each with its count.
fn files_over_the_limit(dir: &str) -> Vec<String> {
    let root = root();
    rust_files(&root.join(dir), &root)
        .into_iter()
        .map(|(p, t)| (p, t.lines().count()))
        .filter(|(_, n)| *n > MAX_SRC_LINES)
        .map(|(p, n)| format!("{p}: {n} lines"))
        .collect()
}

/// Invariant: no file of the library is over 700 lines, so each concern has a home a reader can hold at once.
#[test]
fn no_library_file_is_over_the_limit() {
    let long = files_over_the_limit("src");
    assert!(
        long.is_empty(),
        "library files over {MAX_SRC_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// Invariant: no file of the command line (`cli/src/`) is over 700 lines either: its commands, the demo and the
/// benchmark keep one concern to a file, as the library does.
#[test]
fn no_cli_file_is_over_the_limit() {
    let long = files_over_the_limit("cli/src");
    assert!(
        long.is_empty(),
        "CLI files over {MAX_SRC_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// Panics naming a circle, and every import on one, if the files of `dir` (a crate's `src/`) import one another
/// in a circle.
fn assert_no_import_circle(crate_dir: &str) {
    let base = root().join(crate_dir);
    let edges = import_edges(&rust_files(&base.join("src"), &base));
    let circles: Vec<String> = edges_on_circles(&edges)
        .into_iter()
        .map(|(a, b)| format!("{} → {}", show(&a), show(&b)))
        .collect();
    if let Some(cycle) = a_cycle(&edges) {
        let shown: Vec<String> = cycle.iter().map(|m| show(m)).collect();
        panic!(
            "an import circle in {crate_dir}src: {}\nevery import on a circle:\n{}",
            shown.join(" → "),
            circles.join("\n")
        );
    }
}

/// Invariant: the library's files import one another without a circle (layers run one way, down to the files
/// they use), so any file can be read knowing only what it imports.
#[test]
fn no_import_circle_between_library_files() {
    assert_no_import_circle("");
}

/// Invariant: the command line's files (`cli/src/`) import one another without a circle either.
#[test]
fn no_import_circle_between_cli_files() {
    assert_no_import_circle("cli/");
}

/// Invariant: the leadership runtime reaches the store only through `Store` and `store::statement`, the narrow
/// API its renewals use — not the pool's or the connection layer's internals.
#[test]
fn the_leader_reaches_the_store_only_through_its_statement_api() {
    let root = root();
    let mut wrong = Vec::new();
    for (rel, text) in rust_files(&root.join("src/leader"), &root) {
        for (path, _) in named_paths(&code_only(&text)) {
            let Some(rest) = path.strip_prefix("crate::store::") else {
                continue;
            };
            let first = rest.split("::").next().unwrap_or("");
            if first != "Store" && first != "statement" {
                wrong.push(format!("{rel}: {path}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the leader uses the store's internals:\n{}",
        wrong.join("\n")
    );
}

/// Invariant: no test function is over 120 lines, so each test reads as one check with named steps.
#[test]
fn no_test_is_over_the_limit() {
    let root = root();
    let mut long = Vec::new();
    for (rel, text) in rust_files(&root.join("tests"), &root) {
        for (name, line, n) in long_tests(&text, MAX_TEST_LINES) {
            long.push(format!("{rel}:{line} {name}: {n} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "tests over {MAX_TEST_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[path = "structure/references.rs"]
mod references;

/// The checkers themselves: each one, given a small tree that breaks its rule, says so.
mod checkers {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect()
    }

    /// A circle through a grouped `use` and a `super::` path is found; a parent's re-export of its child and an
    /// inline test module's `use super::*` are not edges.
    #[test]
    fn the_circle_checker_finds_a_circle_and_only_a_circle() {
        let circle = files(&[
            ("src/lib.rs", "mod leader;\npub use leader::held::Held;\n"),
            (
                "src/leader/mod.rs",
                "mod held;\nmod supervisor;\npub use held::Held;\n",
            ),
            (
                "src/leader/held.rs",
                "use super::{supervisor::BoxFuture, Other};\n",
            ),
            (
                "src/leader/supervisor.rs",
                "use crate::leader::held::Held;\nmod tests {\n    use super::*;\n}\n",
            ),
        ]);
        let cycle = a_cycle(&import_edges(&circle)).expect("the circle");
        assert!(cycle.iter().any(|m| show(m) == "leader::held"), "{cycle:?}");
        let no_circle = files(&[
            ("src/lib.rs", "mod leader;\npub use leader::held::Held;\n"),
            (
                "src/leader/mod.rs",
                "mod held;\npub use held::Held;\npub struct Other;\n",
            ),
            (
                "src/leader/held.rs",
                "use super::Other; // crate::leader::held\nmod tests {\n    use super::*;\n}\n",
            ),
        ]);
        assert_eq!(a_cycle(&import_edges(&no_circle)), None);
        // A path written out in a signature (`super::server::Server`) and a module brought in by a grouped `use`
        // (`takeover::CONNECTIONS`) are edges too; a `super::` inside an inline test module is not.
        let spelled_out = files(&[
            ("src/main.rs", "mod bench;\n"),
            ("src/bench/mod.rs", "mod server;\nmod takeover;\n"),
            (
                "src/bench/server.rs",
                "use super::{takeover, Global};\nfn size() -> u32 { takeover::CONNECTIONS }\n",
            ),
            (
                "src/bench/takeover.rs",
                "pub const CONNECTIONS: u32 = 8;\nfn run(server: &super::server::Server) {}\n",
            ),
        ]);
        let cycle = a_cycle(&import_edges(&spelled_out)).expect("the spelled-out circle");
        assert!(
            cycle.iter().any(|m| show(m) == "bench::takeover"),
            "{cycle:?}"
        );
        let inline_only = files(&[
            ("src/main.rs", "mod bench;\n"),
            ("src/bench/mod.rs", "mod server;\nmod takeover;\n"),
            ("src/bench/server.rs", "use super::takeover::CONNECTIONS;\n"),
            (
                "src/bench/takeover.rs",
                "pub const CONNECTIONS: u32 = 8;\nmod tests {\n    fn f(_: super::super::server::Server) {}\n}\n",
            ),
        ]);
        assert_eq!(a_cycle(&import_edges(&inline_only)), None);
    }

    /// A test's length runs from its `fn` line to its closing brace; braces in strings and comments do not count.
    #[test]
    fn the_length_checker_counts_a_test_to_its_closing_brace() {
        let body: String = (0..130).map(|_| "    let s = \"}{\"; // }\n").collect();
        let text = format!("#[tokio::test(flavor = \"multi_thread\")]\nasync fn long() {{\n{body}}}\n#[test]\nfn short() {{\n}}\n");
        assert_eq!(
            long_tests(&text, MAX_TEST_LINES),
            vec![("long".to_owned(), 2, 132)]
        );
        assert_eq!(long_tests(&text, 200), vec![]);
    }
}
