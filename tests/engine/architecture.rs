//! The dependency rule of `docs/architecture.md`, checked on the source:
//! kernels import nothing of the crate; the foundation (errors, parameters,
//! named state, the generator, files) imports only kernels and itself; the
//! tape imports no op or layer; ops import no layer; optimisers neither the
//! tape nor ops nor layers; checkpoints no layer; and nothing of the engine
//! imports the application.
//!
//! A module's imports are the `crate::…` paths of its non-test code (unit
//! tests, after `#[cfg(test)]`, may use anything), with the crate root's
//! re-exports (`crate::Real`, `crate::Tape`, …) resolved to the module that
//! defines them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which top-level modules each module may import (besides itself).
fn allowed(module: &str) -> Option<&'static [&'static str]> {
    const FOUNDATION: [&str; 6] = ["kernels", "error", "param", "rng", "io", "state"];
    Some(match module {
        "kernels" => &[],
        "error" | "rng" => &["kernels"],
        "param" | "io" => &["kernels", "error"],
        "state" => &["kernels", "error", "param", "io"],
        "tape" => &FOUNDATION,
        "ops" => &["kernels", "error", "param", "rng", "io", "state", "tape"],
        "layers" => &[
            "kernels", "error", "param", "rng", "io", "state", "tape", "ops",
        ],
        "optim" => &FOUNDATION,
        "checkpoint" => &["kernels", "error", "param", "rng", "io", "state", "optim"],
        // The application may use everything; lib.rs only declares.
        "app" | "lib" | "main" => return None,
        _ => &[],
    })
}

/// The module that defines each name the crate root re-exports.
fn root_names() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        ("Error", "error"),
        ("ErrorKind", "error"),
        ("Result", "error"),
        ("Real", "kernels"),
        ("ParamGrad", "param"),
        ("GradSource", "param"),
        ("ParamId", "param"),
        ("Parameter", "param"),
        ("RowSparse", "param"),
        ("Rng", "rng"),
        ("Gradients", "tape"),
        ("Tape", "tape"),
        ("Var", "tape"),
        ("prelude", "lib"),
    ])
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments and its unit tests.
fn code(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a piece of code names through `crate::`.
fn imports(code: &str, roots: &BTreeMap<&str, &str>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let names: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the first segment of each item.
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ => {}
                }
                if ch != ',' || depth > 0 {
                    item.push(ch);
                }
            }
            items.push(item);
            items
                .into_iter()
                .map(|s| s.trim().split("::").next().unwrap_or("").trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            vec![name]
        };
        for n in names {
            let n = n.trim_start_matches('{').trim().to_string();
            let module = roots.get(n.as_str()).map_or(n.clone(), |m| m.to_string());
            out.insert(module);
        }
    }
    out
}

#[test]
fn no_module_imports_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let roots = root_names();
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel
            .components()
            .next()
            .expect("a component")
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        let Some(ok) = allowed(&first) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read a source file");
        for m in imports(&code(&text), &roots) {
            if m != first && !ok.contains(&m.as_str()) {
                violations.push(format!("{} imports `{m}`", rel.display()));
            }
        }
        checked += 1;
    }
    assert!(checked > 40, "only {checked} engine files were checked");
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_check_finds_what_it_looks_for() {
    let roots = root_names();
    let found = imports(
        "use crate::{Real, ops::gather, tape::{Tape, Var}};\nlet x = crate::app::model::X;",
        &roots,
    );
    let want: BTreeSet<String> = ["kernels", "ops", "tape", "app"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, want);
    // Comments and unit tests do not count.
    let text = "// crate::app\nfn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::app;\n}\n";
    assert!(imports(&code(text), &roots).is_empty());
}

/// The Python binding reaches the crate through the layers' own API: no
/// file under `python/src` names `splitgrad::ops` or `splitgrad::kernels`.
#[test]
fn the_python_binding_uses_the_layers_api_only() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/src");
    if !dir.exists() {
        // the published crate leaves python/ out
        eprintln!("no python/src beside this crate: nothing to check");
        return;
    }
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(
        files.len() >= 5,
        "only {} files under python/src",
        files.len()
    );
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a binding file");
        for (i, line) in text.lines().enumerate() {
            if line.contains("splitgrad::ops") || line.contains("splitgrad::kernels") {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
