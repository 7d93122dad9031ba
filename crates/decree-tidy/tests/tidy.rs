//! The tidy test: cheap rules over the workspace's product code that keep it readable.
//!
//! TigerBeetle's `src/tidy.zig` is the model. Product code is every `.rs` file under a
//! crate's `src/` (not its `tests/`, `benches/` or `examples/`), this crate excepted. The
//! rules:
//!
//! - A function is at most `FUNCTION_LINES_MAX` lines, counted from its `fn` line to its
//!   closing brace; functions inside `#[cfg(test)]` items are test code and exempt. The
//!   functions that were longer when the rule came in are listed in `ALLOWED_LONG` with
//!   their length, and may only shrink: the test fails when one grows past its entry,
//!   when one got shorter than its entry (lower the entry, so it cannot grow back), and
//!   when one fits the limit or is gone (remove the entry). Every failure prints the
//!   entry to write, and the whole list as measured now, so that a merge can re-measure it.
//! - No `dbg!` anywhere in product code, test modules included.
//! - No `print!`, `println!`, `eprint!` or `eprintln!` in a library outside `#[cfg(test)]`
//!   items: a library reports through `tracing`, its return values or a writer its caller
//!   passes in. Binaries may print: `src/main.rs`, `src/bin/`, and every file of a crate
//!   without a `src/lib.rs` (decree-cli).
//! - Every module opens with its `//!` paragraph: the first non-empty line of every file
//!   starts with `//!` and says something.
//!
//! The sources are read by a small scanner (`scan`), not a parser: it blanks out comments
//! and literals, then follows braces and a few keywords. It does not expand macros, so a
//! function that a macro defines is not seen. Its own tests are at the end of this file.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The longest a product function may be, in lines from `fn` to its closing brace.
const FUNCTION_LINES_MAX: usize = 100;

/// Product functions longer than `FUNCTION_LINES_MAX` when the rule came in, as
/// (file from the workspace root, function, length in lines). The function's name carries
/// its impl's type, trait, module or enclosing function (`Journal::open`). An entry may
/// only go down, and goes when its function fits the limit: it is a list of old debts, not
/// a place for new code. Functions of one file with one name count as one, the longest.
const ALLOWED_LONG: &[(&str, &str, usize)] =
    &[("crates/decree-log/src/engine/journal.rs", "JournalLog::open", 163)];

/// The macros that write to the process's standard output or error.
const PRINT_MACROS: &[&str] = &["print", "println", "eprint", "eprintln"];

#[test]
fn product_functions_are_at_most_100_lines_and_listed_ones_only_shrink() {
    let mut measured = Measured::new();
    for file in product_files() {
        for function in scan(&file.text).functions.into_iter().filter(|f| !f.test) {
            let longest = measured.entry((file.path.clone(), function.name.clone())).or_default();
            if function.lines() > longest.lines {
                *longest = Length { lines: function.lines(), line_first: function.line_first };
            }
        }
    }
    let problems = length_problems(&measured, ALLOWED_LONG);
    assert!(problems.is_empty(), "{}", length_report(&problems, &measured));
}

#[test]
fn product_code_has_no_dbg() {
    let mut problems = Vec::new();
    for file in product_files() {
        for call in scan(&file.text).macros.iter().filter(|m| m.name == "dbg") {
            problems.push(format!(
                "{}:{}: dbg! left in product code: remove it (tracing::debug! is for diagnostics \
                 that stay).",
                file.path, call.line
            ));
        }
    }
    assert!(problems.is_empty(), "tidy: dbg! in product code\n{}", problems.join("\n"));
}

#[test]
fn library_code_does_not_print() {
    let mut problems = Vec::new();
    for file in product_files().into_iter().filter(|f| !f.binary) {
        let scanned = scan(&file.text);
        for call in scanned.macros.iter().filter(|m| !m.test && PRINT_MACROS.contains(&m.name.as_str())) {
            problems.push(format!(
                "{}:{}: {}! in a library: report through tracing, a return value or a writer the \
                 caller passes in; printing belongs to a binary (decree-cli, src/bin/) or to \
                 #[cfg(test)] code.",
                file.path, call.line, call.name
            ));
        }
    }
    assert!(problems.is_empty(), "tidy: output printed by library code\n{}", problems.join("\n"));
}

#[test]
fn every_module_opens_with_its_doc_paragraph() {
    let problems: Vec<String> = product_files()
        .into_iter()
        .filter(|file| !opens_with_doc_paragraph(&file.text))
        .map(|file| {
            format!(
                "{}: the module does not open with its //! paragraph: start the file with //! \
                 lines saying what the module is for, what it is not for and the invariants it \
                 keeps.",
                file.path
            )
        })
        .collect();
    assert!(problems.is_empty(), "tidy: modules without documentation\n{}", problems.join("\n"));
}

/// Whether the first non-empty line of a file is a `//!` line with some text.
fn opens_with_doc_paragraph(text: &str) -> bool {
    let first = text.lines().map(str::trim).find(|line| !line.is_empty());
    first.and_then(|line| line.strip_prefix("//!")).is_some_and(|doc| !doc.trim().is_empty())
}

// ---- The function-length ratchet ----

/// The longest function of each (file, function name), over every product file.
type Measured = BTreeMap<(String, String), Length>;

#[derive(Debug, Default, Clone, Copy)]
struct Length {
    lines: usize,
    line_first: usize,
}

/// What breaks the length rule, one message per problem, each naming the file, line,
/// function and length and saying what to do.
fn length_problems(measured: &Measured, allowed: &[(&str, &str, usize)]) -> Vec<String> {
    let allowed_by_key: BTreeMap<(&str, &str), usize> =
        allowed.iter().map(|&(path, name, lines)| ((path, name), lines)).collect();
    let mut problems = Vec::new();
    for ((path, name), length) in measured {
        let (lines, line) = (length.lines, length.line_first);
        let entry = allowed_by_key.get(&(path.as_str(), name.as_str())).copied();
        match entry {
            None if lines > FUNCTION_LINES_MAX => problems.push(format!(
                "{path}:{line}: fn {name} is {lines} lines, over the limit of {FUNCTION_LINES_MAX}: \
                 split it into functions of at most {FUNCTION_LINES_MAX} lines. (ALLOWED_LONG holds \
                 only functions that were longer when the rule came in; when a merge re-measures \
                 it, this one's entry is: (\"{path}\", \"{name}\", {lines}),)"
            )),
            None => {}
            Some(allowed) if lines > allowed => problems.push(format!(
                "{path}:{line}: fn {name} is {lines} lines and its ALLOWED_LONG entry allows \
                 {allowed}: listed functions may only shrink. Shorten it to {allowed} lines or \
                 fewer (at {FUNCTION_LINES_MAX} or fewer its entry goes)."
            )),
            Some(allowed) if lines <= FUNCTION_LINES_MAX => problems.push(format!(
                "{path}:{line}: fn {name} is {lines} lines, within the limit of \
                 {FUNCTION_LINES_MAX}: remove its entry (\"{path}\", \"{name}\", {allowed}), \
                 from ALLOWED_LONG."
            )),
            Some(allowed) if lines < allowed => problems.push(format!(
                "{path}:{line}: fn {name} is {lines} lines, shorter than the {allowed} its entry \
                 allows: lower the entry in ALLOWED_LONG to (\"{path}\", \"{name}\", {lines}), so \
                 that it cannot grow back."
            )),
            Some(_) => {}
        }
    }
    for (&(path, name), allowed) in &allowed_by_key {
        if !measured.contains_key(&(path.to_string(), name.to_string())) {
            problems.push(format!(
                "ALLOWED_LONG lists (\"{path}\", \"{name}\", {allowed}), but {path} has no \
                 function {name} any more: remove the entry (if the function moved or was \
                 renamed, write its new file, name and length)."
            ));
        }
    }
    problems
}

/// The failure message of the length rule: the problems, then `ALLOWED_LONG` as measured
/// now, ready to paste when a merge re-measures the list.
fn length_report(problems: &[String], measured: &Measured) -> String {
    let mut report = format!(
        "tidy: function length (crates/decree-tidy/tests/tidy.rs, FUNCTION_LINES_MAX = \
         {FUNCTION_LINES_MAX})\n{}\n\nALLOWED_LONG as measured now (for re-measuring the list at \
         a merge; new code gets no entry):\n",
        problems.join("\n")
    );
    for ((path, name), length) in measured {
        if length.lines > FUNCTION_LINES_MAX {
            report.push_str(&format!("    (\"{path}\", \"{name}\", {}),\n", length.lines));
        }
    }
    report
}

// ---- The product files ----

struct SourceFile {
    /// The path from the workspace root, with `/`, as messages and `ALLOWED_LONG` name it.
    path: String,
    text: String,
    /// A binary's file may print: `src/main.rs`, `src/bin/`, or any file of a crate
    /// without `src/lib.rs`.
    binary: bool,
}

/// Every `.rs` file under `crates/*/src/`, this crate's excepted, in a stable order.
fn product_files() -> Vec<SourceFile> {
    let this_crate = fs::canonicalize(env!("CARGO_MANIFEST_DIR")).expect("this crate's directory");
    let root = this_crate.join("../..").canonicalize().expect("the workspace root");
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("the workspace's Cargo.toml");
    assert!(manifest.contains("[workspace]"), "{} is not the workspace root", root.display());
    let mut files = Vec::new();
    for crate_dir in sorted_entries(&root.join("crates")) {
        if crate_dir == this_crate || !crate_dir.join("Cargo.toml").is_file() {
            continue;
        }
        let src = crate_dir.join("src");
        let library = src.join("lib.rs").is_file();
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        for path in paths {
            let in_src = path.strip_prefix(&src).expect("under src");
            let binary = !library || in_src == Path::new("main.rs") || in_src.starts_with("bin");
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let relative = path.strip_prefix(&root).expect("under the workspace root");
            let parts: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            files.push(SourceFile { path: parts.join("/"), text, binary });
        }
    }
    assert!(files.len() >= 10, "found only {} product files under {}", files.len(), root.display());
    files
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries.map(|entry| entry.expect("directory entry").path()).collect();
    paths.sort();
    paths
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for path in sorted_entries(dir) {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            out.push(path);
        }
    }
}

// ---- The scanner ----

/// What the scanner found in one file.
#[derive(Debug, Default)]
struct Scan {
    functions: Vec<Function>,
    macros: Vec<MacroCall>,
}

#[derive(Debug, Clone, PartialEq)]
struct Function {
    /// The name after the names of its enclosing impl's type, trait, module and functions:
    /// `Journal::open`, `run::step`.
    name: String,
    line_first: usize,
    line_last: usize,
    /// Inside an item marked `#[cfg(test)]`.
    test: bool,
}

impl Function {
    fn lines(&self) -> usize {
        self.line_last - self.line_first + 1
    }
}

#[derive(Debug)]
struct MacroCall {
    name: String,
    line: usize,
    /// Inside an item marked `#[cfg(test)]`.
    test: bool,
}

/// The functions and macro calls of a Rust source file.
fn scan(text: &str) -> Scan {
    let tokens = tokens(&blank(text));
    let mut scanner = Scanner::default();
    for at in 0..tokens.len() {
        scanner.step(&tokens, at);
    }
    scanner.scan
}

/// An item whose body has not opened yet: `fn name`, `impl ...`, `trait Name`, `mod name`.
struct Pending {
    /// The name its body adds to the names of what it holds.
    scope: String,
    is_function: bool,
    line: usize,
    /// The depth of parentheses and brackets at its keyword: its body's brace, or the `;`
    /// that ends it without a body, is at the same depth.
    depth: usize,
}

/// An open brace, and the item it is the body of, if any.
struct Frame {
    scope: Option<String>,
    /// The function's full name and first line, when this is a function's body.
    function: Option<(String, usize)>,
    test: bool,
}

#[derive(Default)]
struct Scanner {
    frames: Vec<Frame>,
    pending: Option<Pending>,
    /// The depth of parentheses and brackets at a `#[cfg(test)]` not yet given to an item.
    test_attribute: Option<usize>,
    depth: usize,
    scan: Scan,
}

impl Scanner {
    fn step(&mut self, tokens: &[Token], at: usize) {
        let token = &tokens[at];
        let next = |n: usize| tokens.get(at + n).map_or("", |t| t.text.as_str());
        let in_test = self.test_attribute.is_some() || self.frames.last().is_some_and(|f| f.test);
        match token.text.as_str() {
            "#" if (1..7).map(next).eq(["[", "cfg", "(", "test", ")", "]"]) => {
                self.test_attribute = Some(self.depth)
            }
            "(" | "[" => self.depth += 1,
            ")" | "]" => self.depth = self.depth.saturating_sub(1),
            "fn" | "trait" | "mod" if self.pending.is_none() && is_identifier(next(1)) => {
                self.expect_body(next(1).to_string(), token.text == "fn", token.line)
            }
            "impl" if self.pending.is_none() => {
                self.expect_body(impl_type_name(&tokens[at + 1..]), false, token.line)
            }
            ";" => self.end_without_body(),
            "{" => self.open(in_test),
            "}" => self.close(token.line),
            name if is_identifier(name) && next(1) == "!" && ["(", "[", "{"].contains(&next(2)) => {
                self.scan.macros.push(MacroCall { name: name.to_string(), line: token.line, test: in_test })
            }
            _ => {}
        }
    }

    fn expect_body(&mut self, scope: String, is_function: bool, line: usize) {
        self.pending = Some(Pending { scope, is_function, line, depth: self.depth });
    }

    fn end_without_body(&mut self) {
        if self.pending.as_ref().is_some_and(|p| p.depth == self.depth) {
            self.pending = None;
        }
        if self.test_attribute == Some(self.depth) {
            self.test_attribute = None;
        }
    }

    fn open(&mut self, in_test: bool) {
        let mut frame = Frame { scope: None, function: None, test: in_test };
        if self.pending.as_ref().is_some_and(|p| p.depth == self.depth) {
            let pending = self.pending.take().expect("checked");
            if pending.is_function {
                let outer = self.frames.iter().filter_map(|f| f.scope.as_deref());
                let name: Vec<&str> = outer.chain([pending.scope.as_str()]).collect();
                frame.function = Some((name.join("::"), pending.line));
            }
            frame.scope = Some(pending.scope);
        }
        if self.test_attribute == Some(self.depth) {
            self.test_attribute = None;
        }
        self.frames.push(frame);
    }

    fn close(&mut self, line: usize) {
        let Some(frame) = self.frames.pop() else { return };
        if let Some((name, line_first)) = frame.function {
            self.scan.functions.push(Function { name, line_first, line_last: line, test: frame.test });
        }
    }
}

/// The name of the type an `impl` block is for: the last identifier of its self type
/// outside angle brackets (`Journal` in `impl<S: Storage> Log for Journal<S> where ...`).
fn impl_type_name(tokens: &[Token]) -> String {
    let mut name = "impl";
    let mut angle_depth = 0usize;
    let mut previous = "";
    for token in tokens {
        let text = token.text.as_str();
        match text {
            "{" | ";" | "where" if angle_depth == 0 => break,
            "<" => angle_depth += 1,
            ">" if previous != "-" => angle_depth = angle_depth.saturating_sub(1),
            "for" if angle_depth == 0 => name = "impl",
            "dyn" | "mut" | "const" | "unsafe" => {}
            _ if angle_depth == 0 && is_identifier(text) && previous != "'" => name = text,
            _ => {}
        }
        previous = text;
    }
    name.to_string()
}

fn is_identifier(text: &str) -> bool {
    text.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

struct Token {
    text: String,
    line: usize,
}

/// Splits blanked code into words (identifiers, keywords, numbers) and single punctuation
/// characters, each with its line.
fn tokens(code: &[char]) -> Vec<Token> {
    let mut tokens = Vec::new();
    let (mut at, mut line) = (0, 1);
    while at < code.len() {
        let c = code[at];
        if c == '\n' {
            line += 1;
            at += 1;
        } else if c.is_whitespace() {
            at += 1;
        } else if is_word_char(c) {
            let start = at;
            while at < code.len() && is_word_char(code[at]) {
                at += 1;
            }
            tokens.push(Token { text: code[start..at].iter().collect(), line });
        } else {
            tokens.push(Token { text: c.to_string(), line });
            at += 1;
        }
    }
    tokens
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with comments and string, byte-string, raw-string and character literals
/// replaced by spaces, line breaks kept, so that what is left is code with its line
/// numbers. A `'` starts a character literal only when it starts an escape or closes two
/// characters later; otherwise it is a lifetime or a label (`'a`, `'outer:`).
fn blank(text: &str) -> Vec<char> {
    let mut chars: Vec<char> = text.chars().collect();
    let mut at = 0;
    while at < chars.len() {
        match literal_or_comment_end(&chars, at) {
            Some(end) => {
                chars[at..end].iter_mut().filter(|c| **c != '\n').for_each(|c| *c = ' ');
                at = end;
            }
            None => at += 1,
        }
    }
    chars
}

/// If a comment or a literal starts at `at`, the index just past its end.
fn literal_or_comment_end(chars: &[char], at: usize) -> Option<usize> {
    let char_at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    match (char_at(at), char_at(at + 1)) {
        ('/', '/') => Some(position_from(chars, at, |c| c == '\n').unwrap_or(chars.len())),
        ('/', '*') => Some(block_comment_end(chars, at)),
        ('"', _) => Some(string_end(chars, at + 1)),
        ('\'', '\\') => Some(position_from(chars, at + 3, |c| c == '\'').map_or(chars.len(), |i| i + 1)),
        ('\'', _) if char_at(at + 2) == '\'' => Some(at + 3),
        ('r', _) => raw_string_end(chars, at),
        _ => None,
    }
}

fn position_from(chars: &[char], from: usize, found: impl Fn(char) -> bool) -> Option<usize> {
    chars.get(from..)?.iter().position(|&c| found(c)).map(|i| from + i)
}

/// The end of a block comment starting at `at`; block comments nest.
fn block_comment_end(chars: &[char], at: usize) -> usize {
    let (mut i, mut depth) = (at, 0usize);
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => (depth, i) = (depth + 1, i + 2),
            ('*', '/') if depth == 1 => return i + 2,
            ('*', '/') => (depth, i) = (depth - 1, i + 2),
            _ => i += 1,
        }
    }
    chars.len()
}

/// The end of a string whose first character after the opening quote is at `from`.
fn string_end(chars: &[char], from: usize) -> usize {
    let mut i = from;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// If a raw string (`r"…"`, `r#"…"#`, `br#"…"#`, `cr"…"`) has its `r` at `at`, the index
/// just past its end. An `r` inside a word (`bar"`) or in a raw identifier (`r#type`) is
/// not one.
fn raw_string_end(chars: &[char], at: usize) -> Option<usize> {
    let word_before = |n: usize| at.checked_sub(n).is_some_and(|i| is_word_char(chars[i]));
    let prefix = |n: usize| at.checked_sub(n).is_some_and(|i| matches!(chars[i], 'b' | 'c'));
    let starts_word = !word_before(1) || (prefix(1) && !word_before(2));
    let hashes = chars.get(at + 1..)?.iter().take_while(|&&c| c == '#').count();
    if !starts_word || chars.get(at + 1 + hashes) != Some(&'"') {
        return None;
    }
    let closing: Vec<char> = std::iter::once('"').chain("#".repeat(hashes).chars()).collect();
    let body = at + 2 + hashes;
    let end = (body..chars.len()).find(|&i| chars[i..].starts_with(&closing));
    Some(end.map_or(chars.len(), |i| i + closing.len()))
}

// ---- Tests of the scanner and of the ratchet ----

fn function_lengths(text: &str) -> Vec<(String, usize, bool)> {
    scan(text).functions.into_iter().map(|f| (f.name.clone(), f.lines(), f.test)).collect()
}

#[test]
fn the_scanner_ignores_braces_in_strings_chars_and_comments() {
    let text = r####"
fn strings() {
    let a = "{ \" {";
    let b = r#"{ "} {"#;
    let c = br##"{"#}"##;
    let d = '{';
    let e = '\'';
    let f = b'}';
    let g = '\u{7B}';
}
// fn commented() {
/* fn blocked() { /* nested } */ { */
/// A doc comment with an example: `fn doc() {`
fn after() {}
"####;
    assert_eq!(function_lengths(text), [("strings".to_string(), 9, false), ("after".to_string(), 1, false)]);
}

#[test]
fn the_scanner_tells_lifetimes_and_labels_from_char_literals() {
    let text = "
fn borrow<'a>(x: &'a str) -> &'a str {
    'outer: loop {
        break 'outer;
    }
    let c = 'x';
    x
}
fn next() {}
";
    assert_eq!(function_lengths(text), [("borrow".to_string(), 7, false), ("next".to_string(), 1, false)]);
}

#[test]
fn the_scanner_names_functions_by_impl_trait_module_and_enclosing_function() {
    let text = "
impl<S: Storage, F: Fn() -> u8> Log for Journal<S> where S: Send {
    fn append(&self) {
        fn helper() {}
    }
}
trait Engine {
    fn declared(&self) -> [u8; 4];
    fn provided(&self) {}
}
mod inner {
    fn free(f: fn(u8) -> u8) -> impl Fn(u8) -> u8 { f }
}
";
    let names: Vec<String> = function_lengths(text).into_iter().map(|(name, _, _)| name).collect();
    assert_eq!(names, ["Journal::append::helper", "Journal::append", "Engine::provided", "inner::free"]);
}

#[test]
fn the_scanner_marks_cfg_test_items_as_test_code() {
    let text = "
fn product() { println!(\"a\"); }
#[cfg(test)]
use std::fmt;
fn also_product() {}
#[cfg(test)]
mod tests {
    #[test]
    fn a_test() { eprintln!(\"skipped\"); dbg!(1); }
}
";
    let scanned = scan(text);
    let functions: Vec<(&str, bool)> = scanned.functions.iter().map(|f| (f.name.as_str(), f.test)).collect();
    assert_eq!(functions, [("product", false), ("also_product", false), ("tests::a_test", true)]);
    let macros: Vec<(&str, usize, bool)> =
        scanned.macros.iter().map(|m| (m.name.as_str(), m.line, m.test)).collect();
    assert_eq!(macros, [("println", 2, false), ("eprintln", 9, true), ("dbg", 9, true)]);
}

#[test]
fn the_scanner_sees_no_macro_in_a_comparison_or_a_string() {
    let text = "fn f(a: u8) -> bool { let s = \"dbg!(a)\"; a != 1 && !matches!(a, 2) }";
    let names: Vec<String> = scan(text).macros.into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["matches"]);
}

#[test]
fn a_module_needs_a_doc_paragraph_as_its_first_line() {
    assert!(opens_with_doc_paragraph("\n//! The journal.\n\nuse std::fs;\n"));
    assert!(!opens_with_doc_paragraph("// The journal.\n//! Late.\n"));
    assert!(!opens_with_doc_paragraph("//!\nuse std::fs;\n"));
    assert!(!opens_with_doc_paragraph("#![allow(unused)]\n//! After an attribute.\n"));
    assert!(!opens_with_doc_paragraph(""));
}

#[test]
fn the_ratchet_fails_on_new_grown_shrunk_fitting_and_gone_functions() {
    let length = |lines| Length { lines, line_first: 7 };
    let measured: Measured = [
        ("a.rs", "new", 101),
        ("a.rs", "grown", 130),
        ("a.rs", "shrunk", 110),
        ("a.rs", "fits", 100),
        ("a.rs", "same", 120),
        ("a.rs", "short", 12),
    ]
    .into_iter()
    .map(|(path, name, lines)| ((path.to_string(), name.to_string()), length(lines)))
    .collect();
    let allowed = [
        ("a.rs", "grown", 120),
        ("a.rs", "shrunk", 120),
        ("a.rs", "fits", 140),
        ("a.rs", "same", 120),
        ("a.rs", "gone", 150),
    ];
    let problems = length_problems(&measured, &allowed);
    let expected = [
        "a.rs:7: fn fits is 100 lines, within the limit",
        "a.rs:7: fn grown is 130 lines and its ALLOWED_LONG entry allows 120",
        "a.rs:7: fn new is 101 lines, over the limit of 100",
        "a.rs:7: fn shrunk is 110 lines, shorter than the 120",
        "ALLOWED_LONG lists (\"a.rs\", \"gone\", 150)",
    ];
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    for (problem, start) in problems.iter().zip(expected) {
        assert!(problem.starts_with(start), "{problem:?} should start with {start:?}");
    }
    assert!(problems[2].contains("(\"a.rs\", \"new\", 101),"), "{}", problems[2]);
    assert!(problems[3].contains("(\"a.rs\", \"shrunk\", 110),"), "{}", problems[3]);
    let report = length_report(&problems, &measured);
    assert!(report.ends_with(
        "    (\"a.rs\", \"grown\", 130),\n    (\"a.rs\", \"new\", 101),\n    (\"a.rs\", \"same\", \
         120),\n    (\"a.rs\", \"shrunk\", 110),\n"
    ));
}
