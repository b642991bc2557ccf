//! Checks of the crate's source layout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file and directory under this crate's `src/`.
pub(crate) fn source_tree() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path.clone());
            }
            found.push(path);
        }
    }
    found
}

/// No two modules of the crate share a name, so a module's name says which file it is: a
/// directory or a `.rs` file names a module (`mod.rs`, `lib.rs` and `main.rs` take their
/// directory's or the crate's name). Inline `mod tests { … }` blocks are not files and keep Rust's
/// usual name.
#[test]
fn no_two_modules_of_the_crate_share_a_name() {
    let mut by_name: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for path in source_tree() {
        let name = if path.is_dir() {
            path.file_name()
        } else if path.extension().is_some_and(|e| e == "rs") {
            path.file_stem()
                .filter(|s| !["mod", "lib", "main"].map(std::ffi::OsStr::new).contains(s))
        } else {
            None
        };
        if let Some(name) = name {
            by_name
                .entry(name.to_string_lossy().into_owned())
                .or_default()
                .push(path);
        }
    }
    assert!(
        by_name.contains_key("batches") && by_name.contains_key("hard_delete"),
        "the walk reaches nested modules: {:?}",
        by_name.keys().collect::<Vec<_>>()
    );
    let shared: Vec<String> = by_name
        .iter()
        .filter(|(_, paths)| paths.len() > 1)
        .map(|(name, paths)| format!("{name}: {paths:?}"))
        .collect();
    assert!(
        shared.is_empty(),
        "modules named alike:\n{}",
        shared.join("\n")
    );
}
