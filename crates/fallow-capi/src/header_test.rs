//! `struct fallow_stats` of `include/fallow.h` against `FallowStats`, the struct generated from
//! the table of the statistics: same fields, in the same order, of the same types and sizes, at
//! the same offsets. A figure added to the table's C part and not to the header (or the other way
//! round), a field moved or an array resized fails here.

use core_fallow::binding_support::{CField, C_FIELDS, C_STATS_V1_SIZE, C_STATS_V2_SIZE};

use crate::FallowStats;

const HEADER: &str = include_str!("../../../include/fallow.h");

/// A field as the header declares it: name, element type, array dimensions, offset.
#[derive(Debug, PartialEq, Eq)]
struct Declared {
    name: String,
    c_type: String,
    dims: Vec<usize>,
    offset: usize,
}

fn without_comments(mut s: &str) -> String {
    let mut out = String::new();
    while let Some(i) = s.find("/*") {
        out.push_str(&s[..i]);
        let end = s[i..].find("*/").expect("unterminated comment in fallow.h");
        s = &s[i + end + 2..];
    }
    out.push_str(s);
    out
}

/// The value of `#define NAME <integer>` in the header.
fn define(text: &str, name: &str) -> usize {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|l| l.split_once(char::is_whitespace))
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("fallow.h does not define {name}"))
        .1
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("fallow.h: {name} is not an integer: {e}"))
}

/// The fields of `struct fallow_stats` as declared in `header`, with the offsets C gives them.
fn declared(header: &str) -> Vec<Declared> {
    let text = without_comments(header);
    let start = text.find("typedef struct fallow_stats {").expect("no struct fallow_stats in fallow.h");
    let body = &text[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find("} fallow_stats;").expect("no } fallow_stats;")];
    let mut offset = 0;
    let mut fields = Vec::new();
    for decl in body.split(';').map(str::trim).filter(|d| !d.is_empty()) {
        let (c_type, rest) =
            decl.split_once(char::is_whitespace).unwrap_or_else(|| panic!("bad field {decl:?}"));
        assert_eq!(c_type, "uint64_t", "field {decl:?}: only uint64_t fields are expected");
        let mut parts = rest.trim().split('[');
        let name = parts.next().unwrap().trim().to_string();
        let dims: Vec<usize> = parts
            .map(|d| {
                let d = d.trim().strip_suffix(']').unwrap_or_else(|| panic!("bad dimension in {decl:?}"));
                d.parse().unwrap_or_else(|_| define(&text, d))
            })
            .collect();
        fields.push(Declared { name, c_type: c_type.to_string(), dims: dims.clone(), offset });
        offset += 8 * dims.iter().product::<usize>();
    }
    fields.push(Declared { name: "(end)".into(), c_type: String::new(), dims: vec![], offset });
    fields
}

/// The same list from the Rust side.
fn generated(fields: &[CField], size: usize) -> Vec<Declared> {
    let mut v: Vec<Declared> = fields
        .iter()
        .map(|f| {
            Declared { name: f.name.into(), c_type: f.c_type.into(), dims: f.dims.to_vec(), offset: f.offset }
        })
        .collect();
    v.push(Declared { name: "(end)".into(), c_type: String::new(), dims: vec![], offset: size });
    v
}

#[test]
fn header_struct_matches_the_table() {
    let rust = generated(C_FIELDS, core::mem::size_of::<FallowStats>());
    let c = declared(HEADER);
    for (i, (r, c)) in rust.iter().zip(&c).enumerate() {
        assert_eq!(r, c, "field {i} of struct fallow_stats: the table says {r:?}, include/fallow.h {c:?}");
    }
    let (nr, nc) = (rust.len(), c.len());
    assert_eq!(nr, nc, "struct fallow_stats: {nr} fields in the table, {nc} in include/fallow.h");
}

#[test]
fn the_check_sees_a_field_on_one_side_only() {
    let rust = generated(C_FIELDS, core::mem::size_of::<FallowStats>());
    let last = C_FIELDS.last().unwrap().name;
    let decl = format!("uint64_t {last}");
    let added = HEADER.replacen(&decl, &format!("uint64_t extra_count;\n    {decl}"), 1);
    assert_ne!(declared(&added), rust);
    let dropped = HEADER.replacen("uint64_t slack_bytes;", "", 1);
    assert_ne!(declared(&dropped), rust);
    let moved = HEADER
        .replacen("uint64_t live_blocks;", "", 1)
        .replacen(&decl, &format!("uint64_t live_blocks;\n    {decl}"), 1);
    assert_ne!(declared(&moved), rust);
    assert_eq!(declared(HEADER), rust);
}

/// The header's `FALLOW_SMALL_MAX` is the Rust constant it documents.
#[test]
fn the_header_names_the_largest_small_object() {
    assert_eq!(define(&without_comments(HEADER), "FALLOW_SMALL_MAX"), core_fallow::Allocator::SMALL_MAX);
}

/// The older structs end where the header's fields of each later version begin: the memory
/// limit's (`C_STATS_V1_SIZE`, what `fallow_stats_read` writes) and the small objects'
/// (`C_STATS_V2_SIZE`), which sit after every figure of the versions before them.
#[test]
fn older_struct_sizes_end_where_the_header_adds_fields() {
    let c = declared(HEADER);
    let offset = |name: &str| c.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no {name} in fallow.h")).offset;
    assert_eq!(C_STATS_V1_SIZE, offset("memory_limit_bytes"));
    assert_eq!(C_STATS_V2_SIZE, offset("small_live_objects"));
    let v2: Vec<&str> = c.iter().filter(|f| f.offset >= C_STATS_V2_SIZE && f.name != "(end)").map(|f| f.name.as_str()).collect();
    let small =
        ["small_live_objects", "small_live_bytes", "small_spans", "small_span_bytes", "small_spare_spans", "small_free_bytes"];
    assert_eq!(v2, small, "the fields after the second version's struct");
    assert!(C_STATS_V1_SIZE < C_STATS_V2_SIZE && C_STATS_V2_SIZE < core::mem::size_of::<FallowStats>());
}
