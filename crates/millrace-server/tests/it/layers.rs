//! No two modules of the server, or of the service crate under it, import each other, directly
//! or in a circle: the `crate::` paths each source file names form a graph without cycles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The module a source file is (`src/shares/system.rs` is `shares`: a module and its children
/// are one node).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `crate::name` references outside comments, and names a `use crate::{a, b}` brings in.
fn uses(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let rest = rest.trim_start_matches('{');
            let name = rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ',' || c == ' '))
                .next()
                .unwrap_or("");
            for n in name.split(',') {
                let n = n.trim();
                if modules.contains(n) {
                    out.insert(n.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn modules_depend_one_way() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    check(&here.join("src"), 5);
    // The service layer the server is built on, once part of this crate.
    check(&here.join("../millrace-service/src"), 10);
}

fn check(src: &Path, least: usize) {
    let src = src.to_path_buf();
    let mut all = Vec::new();
    files(&src, &mut all);
    let modules: BTreeSet<String> = all
        .iter()
        .map(|f| module_of(&src, f))
        .filter(|m| m != "lib")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &all {
        let m = module_of(&src, f);
        if m == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let mut deps = uses(&text, &modules);
        deps.remove(&m);
        graph.entry(m).or_default().extend(deps);
    }
    assert!(graph.len() >= least, "too few modules found: {graph:?}");
    // Depth-first search for a cycle, reporting the path that closes it.
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(i) = path.iter().position(|p| p == m) {
            panic!(
                "modules import each other in a circle: {} -> {m}",
                path[i..].join(" -> ")
            );
        }
        if done.contains(m) {
            return;
        }
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            visit(d, g, path, done);
        }
        path.pop();
        done.insert(m.to_string());
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done);
    }
}
