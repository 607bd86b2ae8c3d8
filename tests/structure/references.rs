//! References that cannot rot: the one table of the code's files (docs/architecture.md, "Every file") lists every
//! file of `src/` and `cli/src/` exactly once and nothing else, no source file restates it, and no comment,
//! migration, script or document names a file of this repository that does not exist.
//!
//! First run against the tree it was written for, the reference check found the eight names the code had
//! outgrown (`src/fence.rs`, `src/lease.rs`, `src/store.rs`, `src/membership.rs`, `src/leader/pg.rs`,
//! `src/leader/assign.rs`, `src/leader/supervisor.rs`, `tests/surface.rs`); the unit tests at the end feed each
//! checker a small tree that breaks its rule.

use std::collections::BTreeSet;
use std::fs;

use super::{root, rust_files};

/// The directories at the repository's top whose files the tree's text refers to by path.
const TOP: &[&str] = &[
    "src/",
    "tests/",
    "cli/",
    "docs/",
    "migrations/",
    "native/",
    "benches/",
    "examples/",
    "sql/",
    ".ci/",
];

/// The extensions of the files whose text is checked (plus the extensionless scripts of `.ci/`).
const TEXT: &[&str] = &["rs", "sql", "md", "c", "h", "py", "sh", "toml", "spec"];

/// Every text file of the repository that is checked, as (path relative to the root, text): the tracked tree
/// without build output. This file and tests/structure.rs are left out: their checkers' own unit tests name
/// made-up files on purpose.
fn text_files() -> Vec<(String, String)> {
    let root = root();
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "node_modules") {
                    stack.push(path);
                }
                continue;
            }
            let checked = path
                .extension()
                .is_some_and(|e| TEXT.iter().any(|t| e == *t))
                || (rel.starts_with(".ci/") && path.extension().is_none());
            if !checked || rel == "tests/structure.rs" || rel.starts_with("tests/structure/") {
                continue;
            }
            if let Ok(text) = fs::read_to_string(&path) {
                out.push((rel, text));
            }
        }
    }
    out.sort();
    out
}

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// The repository paths a text names: a token that starts with one of [`TOP`] where no path or word goes on
/// before it (so `…/pgxs/src/test` and a URL's `…/blob/main/src/x.rs` are someone else's paths). A token followed
/// by `…`, `*`, `{` or `<` is a pattern (`migrations/2026-11-30-…/up.sql`), not a name, and is skipped.
fn named_paths(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let before = i.checked_sub(1).map(|j| chars[j]);
        let free = before.is_none_or(|c| !(path_char(c) || matches!(c, '$' | '}' | '~' | '@')));
        let starts = free
            && TOP
                .iter()
                .any(|t| t.chars().zip(&chars[i..]).all(|(a, &b)| a == b))
            && chars.len() - i >= 2;
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && path_char(chars[j]) {
            j += 1;
        }
        let pattern = chars
            .get(j)
            .is_some_and(|c| matches!(c, '…' | '*' | '{' | '<'));
        let token: String = chars[i..j].iter().collect();
        let token = token.trim_end_matches(['.', '-', '/']).to_owned();
        if !pattern && token.contains('/') && !token.ends_with("/..") {
            out.push(token);
        }
        i = j.max(i + 1);
    }
    out
}

/// The relative targets of a Markdown file's links (`[text](target)`), without their `#anchor`; links to the web,
/// mail and anchors of the same page are not files.
fn markdown_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(k) = rest.find("](") {
        rest = &rest[k + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        let target = target.split('#').next().unwrap_or("");
        let web = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !web {
            out.push(target.to_owned());
        }
    }
    out
}

/// The references among `files` that name nothing, as `file: path`. A path may be written from the repository's
/// root, from the crate the file belongs to (`cli/` for the command line's files) or from the file's own
/// directory; a Markdown link from the file's directory, as Markdown reads it.
fn dangling(files: &[(String, String)], exists: impl Fn(&str) -> bool) -> Vec<String> {
    let mut out = BTreeSet::new();
    for (rel, text) in files {
        let dir = rel.rsplit_once('/').map_or("", |(d, _)| d);
        let krate = rel.split_once('/').map_or("", |(top, _)| match top {
            "cli" | "native" => top,
            _ => "",
        });
        for path in named_paths(text) {
            let bases = ["", krate, dir];
            let found = bases.iter().any(|b| {
                let full = if b.is_empty() {
                    path.clone()
                } else {
                    format!("{b}/{path}")
                };
                exists(&full)
            });
            if !found {
                out.insert(format!("{rel}: {path}"));
            }
        }
        if rel.ends_with(".md") {
            for link in markdown_links(text) {
                if !exists(&normalize(dir, &link)) {
                    out.insert(format!("{rel}: link ({link})"));
                }
            }
        }
    }
    out.into_iter().collect()
}

/// `target` read from directory `dir` of the repository (`..` and `.` resolved), as a path from its root.
fn normalize(dir: &str, target: &str) -> String {
    let mut parts: Vec<&str> = dir.split('/').filter(|s| !s.is_empty()).collect();
    for seg in target.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

/// The first cells of the rows of docs/architecture.md's "Every file" section: the files it lists.
fn file_table(doc: &str) -> Vec<String> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Every file"))
        .unwrap_or("");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(p, _)| p.to_owned()))
        .collect()
}

/// Invariant: no comment, migration, script or document of the repository names a file or directory of it
/// that does not exist, and no Markdown link leads nowhere: a name that outlived a split is a lie to its reader.
#[test]
fn no_reference_names_a_missing_file() {
    let root = root();
    let files = text_files();
    assert!(files.len() > 100, "too few files found: {}", files.len());
    let missing = dangling(&files, |p| root.join(p).exists());
    assert!(
        missing.is_empty(),
        "references to files that do not exist (name the file as it is now):\n{}",
        missing.join("\n")
    );
}

/// Invariant: docs/architecture.md's table of files is the one table, and complete: every file of `src/` and
/// `cli/src/` is a row, once; every row is a file.
#[test]
fn the_file_table_lists_every_file_once() {
    let root = root();
    let doc = fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let rows = file_table(&doc);
    let listed: BTreeSet<String> = rows.iter().cloned().collect();
    let twice: Vec<&String> = rows
        .iter()
        .filter(|r| rows.iter().filter(|s| s == r).count() > 1)
        .collect();
    let on_disk: BTreeSet<String> = ["src", "cli/src"]
        .iter()
        .flat_map(|d| rust_files(&root.join(d), &root))
        .map(|(p, _)| p)
        .collect();
    let unlisted: Vec<_> = on_disk.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&on_disk).collect();
    assert!(
        unlisted.is_empty() && gone.is_empty() && twice.is_empty(),
        "docs/architecture.md's table of files is out of date:\nnot listed: {unlisted:?}\nlisted, but no such \
         file: {gone:?}\nlisted twice: {twice:?}"
    );
}

/// Invariant: no source file keeps a table of modules or files of its own (the one table is docs/architecture.md),
/// so there is nothing to drift apart.
#[test]
fn no_source_file_restates_the_file_table() {
    let root = root();
    let restated: Vec<String> = ["src", "cli/src"]
        .iter()
        .flat_map(|d| rust_files(&root.join(d), &root))
        .filter(|(_, text)| restates_the_table(text))
        .map(|(p, _)| p)
        .collect();
    assert!(
        restated.is_empty(),
        "files with a module table of their own (move it to docs/architecture.md):\n{}",
        restated.join("\n")
    );
}

fn restates_the_table(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        l.starts_with("//! | file |") || l.starts_with("//! | module |")
    })
}

mod checkers {
    use super::*;

    fn tree(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect()
    }

    /// Old names are found in comments, migrations and docs; names that exist from the root, the crate or the
    /// file's directory, other programs' paths, patterns and web links are not.
    #[test]
    fn the_reference_checker_finds_old_names_and_only_those() {
        let existing = [
            "src/lease",
            "src/lease/mod.rs",
            "cli/src/main.rs",
            "tests/regress/sql/protocol.sql",
            "docs/a.md",
            "docs/b.md",
        ];
        let exists = |p: &str| existing.contains(&p);
        let files = tree(&[
            ("src/x.rs", "// see src/lease.rs and src/lease/mod.rs.\n"),
            ("migrations/1/up.sql", "-- Called from Rust by src/fence.rs (…).\n"),
            ("cli/Cargo.toml", "path = \"src/main.rs\"\n"),
            ("tests/regress/run.sh", "# sql/protocol.sql, $dir/pgxs/src/test/x\n"),
            (
                "docs/a.md",
                "[b](b.md#x), [c](c.md), [w](https://h/x/src/gone.rs), `migrations/2026-…/up.sql`, `src/lease/`\n",
            ),
        ]);
        assert_eq!(
            dangling(&files, exists),
            vec![
                "docs/a.md: link (c.md)".to_owned(),
                "migrations/1/up.sql: src/fence.rs".to_owned(),
                "src/x.rs: src/lease.rs".to_owned(),
            ]
        );
    }

    /// The table's rows are read from its section only; a source file's own table is seen.
    #[test]
    fn the_table_checkers_read_the_table_and_see_a_second_one() {
        let doc = "# A\n\n| `src/other.rs` | not the table |\n\n## Every file\n\n| file | owns |\n|---|---|\n| `src/lib.rs` | root |\n| `src/a.rs` | a |\n\n## Next\n| `src/b.rs` | b |\n";
        assert_eq!(file_table(doc), vec!["src/lib.rs", "src/a.rs"]);
        assert!(restates_the_table("//! text\n//! | file | owns |\n"));
        assert!(!restates_the_table("/// | metric | type |\n"));
    }
}
