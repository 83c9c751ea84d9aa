//! The docs stay true: every relative link and `#anchor` in the Markdown a user reads (README, CHANGELOG, docs/,
//! the chart's README) resolves inside the repository (a link that leaves it, such as `../shared/…`, is refused
//! even where its target exists beside this checkout: a fresh clone has nothing there), and every shell block is
//! either run by a test (the README's `local-path` blocks, tests/readme_local_path.rs) or says why it is not
//! (`<!-- not run: <reason> -->` on the line before its fence). The example manifests are validated against the
//! CRDs and the chart's schema by scripts/chart-check.sh; docs/reference/ is checked against the code by
//! tests/reference_docs.rs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The Markdown files users read.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut files = vec![
        root.join("README.md"),
        root.join("CHANGELOG.md"),
        root.join("charts/redlock-operator/README.md"),
    ];
    let mut pending = vec![root.join("docs")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/ exists") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The lines outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((number + 1, line));
        }
    }
    lines
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces made `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors a document's headings make, duplicates numbered as GitHub numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose(text) {
        let trimmed = line.trim_start();
        if !trimmed.starts_with('#') {
            continue;
        }
        let heading = trimmed.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        // Inline code and links show their text.
        let visible: String = heading.replace('`', "");
        let base = slug(&visible);
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        };
        *count += 1;
        anchors.insert(anchor);
    }
    anchors
}

/// The link targets of a line: `[text](target)` and `[text](target "title")`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let Some(end) = after.find(')') else {
            break;
        };
        let target = after[..end].split_whitespace().next().unwrap_or_default();
        targets.push(target.trim_matches(|c| c == '<' || c == '>').to_owned());
        rest = &after[end..];
    }
    targets
}

/// Where a relative link from `file` (a Markdown file under `root`) points, or `None` when it leaves the
/// repository: an absolute path, or a `..` that climbs above `root` at any step (`../main/README.md` from the
/// root's README would resolve only in a checkout that happens to be named `main`). Lexical, so that a target
/// which exists beside this checkout does not make the link pass.
fn inside_repository(root: &Path, file: &Path, path: &str) -> Option<PathBuf> {
    use std::path::Component;
    let directory = file.parent()?.strip_prefix(root).ok()?;
    let mut within: Vec<&std::ffi::OsStr> = directory
        .components()
        .map(|component| component.as_os_str())
        .collect();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(name) => within.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                within.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(
        within
            .iter()
            .fold(root.to_owned(), |resolved, name| resolved.join(name)),
    )
}

/// What is wrong with the relative links and anchors of one document: each `file:line: target: why`.
fn link_problems(root: &Path, file: &Path, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let shown = file.strip_prefix(root).unwrap_or(file).display().to_string();
    for (number, line) in prose(text) {
        // Inline code is not a link.
        let without_code: String = line
            .split('`')
            .enumerate()
            .filter(|(index, _)| index % 2 == 0)
            .map(|(_, part)| part)
            .collect();
        for target in link_targets(&without_code) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.to_owned()
            } else {
                match inside_repository(root, file, path) {
                    Some(resolved) => resolved,
                    None => {
                        problems.push(format!(
                            "{shown}:{number}: {target}: leaves the repository or is absolute (a fresh clone has \
                             nothing there; link a file in the repository or a public https:// page)"
                        ));
                        continue;
                    }
                }
            };
            if !resolved.exists() {
                problems.push(format!("{shown}:{number}: {target}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor
                && resolved.extension().is_some_and(|ext| ext == "md")
            {
                let target_text = std::fs::read_to_string(&resolved).expect("readable");
                if !anchors(&target_text).contains(anchor) {
                    problems.push(format!("{shown}:{number}: {target}: no heading makes #{anchor}"));
                }
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = Path::new(ROOT);
    let mut problems = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("readable");
        problems.extend(link_problems(root, &file, &text));
    }
    assert!(problems.is_empty(), "broken links:\n{}", problems.join("\n"));
}

#[test]
fn every_shell_block_is_run_by_a_test_or_says_why_not() {
    let mut problems = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("readable");
        let shown = file.strip_prefix(ROOT).unwrap_or(&file).display().to_string();
        let lines: Vec<&str> = text.lines().collect();
        let mut fenced = false;
        for (index, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            if !trimmed.starts_with("```") {
                continue;
            }
            if fenced {
                fenced = false;
                continue;
            }
            fenced = true;
            let language = trimmed.trim_start_matches('`').trim();
            if !matches!(language, "sh" | "bash" | "shell" | "console") {
                continue;
            }
            let before = index
                .checked_sub(1)
                .and_then(|previous| lines.get(previous))
                .map(|line| line.trim())
                .unwrap_or_default();
            let marked = before.starts_with("<!-- local-path:")
                || before
                    .strip_prefix("<!-- not run:")
                    .is_some_and(|reason| reason.trim_end_matches("-->").trim().len() > 3);
            if !marked {
                problems.push(format!(
                    "{shown}:{}: a ```{language} block with neither `<!-- local-path: ... -->` (run by \
                     tests/readme_local_path.rs) nor `<!-- not run: <reason> -->` on the line before",
                    index + 1
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// Negative controls: the checks find what they must.

#[test]
fn anchors_follow_githubs_rules() {
    let text = "# Guarantees and limits\n## `lock --wait` (fair)\n```sh\n# not a heading\n```\n## Guarantees and limits\n";
    let made = anchors(text);
    assert!(made.contains("guarantees-and-limits"));
    assert!(made.contains("lock---wait-fair"));
    assert!(made.contains("guarantees-and-limits-1"), "{made:?}");
    assert!(!made.contains("not-a-heading"));
    assert_eq!(
        link_targets("see [a](../a.md#x) and [b](b.md \"title\")"),
        ["../a.md#x", "b.md"]
    );
}

#[test]
fn links_that_leave_the_repository_are_refused_even_where_their_target_exists() {
    let root = Path::new(ROOT);
    let readme = root.join("README.md");
    let guide = root.join("docs/how-to/install.md");
    // The parent of the checkout exists on every machine, and `../main/README.md` from the README resolves
    // here when the checkout is named `main`: both must still be refused.
    let checkout = root
        .file_name()
        .and_then(|name| name.to_str())
        .expect("the checkout's folder name");
    let text = format!(
        "[up](../)\n[seeds](../shared/seeds/)\n[self](../{checkout}/README.md)\n[abs]({ROOT}/README.md)\n"
    );
    let problems = link_problems(root, &readme, &text);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(
        problems
            .iter()
            .all(|problem| problem.contains("leaves the repository")),
        "{problems:#?}"
    );
    assert!(problems[0].starts_with("README.md:1: ../: "), "{problems:#?}");
    // Climbing back to the root is fine; one step more is not.
    assert_eq!(
        link_problems(
            root,
            &guide,
            "[r](../../README.md#a-first-lock) [c](../../CHANGELOG.md)\n"
        ),
        Vec::<String>::new()
    );
    assert_eq!(link_problems(root, &guide, "[x](../../../README.md)\n").len(), 1);
    // External pages are not checked here.
    assert!(link_problems(root, &readme, "[d](https://example.org/x)\n").is_empty());
}

/// Every reference to the operator's own image in the examples and the docs names this release's version, so
/// that a long-form example applied as written runs the binary the chart installed (not a stale `0.1.0`).
#[test]
fn the_examples_and_docs_name_the_operators_image_of_this_version() {
    let wanted = format!("redlock-operator:{}", env!("CARGO_PKG_VERSION"));
    let mut files = documents();
    let examples = Path::new(ROOT).join("examples");
    let mut stack = vec![examples];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read examples/").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    let mut stale = Vec::new();
    let mut seen = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            // `localhost/redlock-operator:0.2.0`, `.../redlock-operator:0.1.0`: an image reference with a version.
            for (at, _) in line.match_indices("redlock-operator:") {
                let rest = &line[at + "redlock-operator:".len()..];
                if !rest.starts_with(|c: char| c.is_ascii_digit()) {
                    continue;
                }
                seen += 1;
                if !line[at..].starts_with(&wanted) {
                    stale.push(format!("{}:{}: {}", file.display(), number + 1, line.trim()));
                }
            }
        }
    }
    assert!(seen > 0, "no example names the operator's image with a version");
    assert!(
        stale.is_empty(),
        "these name another version of the operator's image than {wanted}:\n{}",
        stale.join("\n")
    );
}
