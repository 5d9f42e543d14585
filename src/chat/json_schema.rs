//! `response_format: json_schema`: a JSON Schema compiled to the nodes that `SchemaMachine`
//! walks byte by byte. Owns the subset and its refusals; knows nothing of tokens or HTTP.
//!
//! The subset is what can be kept by a deterministic byte walk: `type` (one or a list), `enum`,
//! `const`, `properties` / `required` / `additionalProperties`, `items` / `minItems` /
//! `maxItems`, `anyOf` / `oneOf` whose branches start with different characters, `$ref` into
//! `$defs` / `definitions` (recursion included). Annotations (`title`, `description`,
//! `format`, ...) are accepted and not enforced (`format` is an annotation in JSON Schema
//! 2020-12). Any other keyword is refused by name, never silently ignored. Objects are written
//! with their declared properties in name order, as the schema is shown to the model (every
//! required one, optional ones may be left out) and no others: every reply the walk allows is
//! valid against the schema.

use serde_json::Value;
use std::collections::HashMap;

/// Keywords accepted and not enforced (space-separated).
const ANNOTATIONS: &str =
    "title description default examples format $schema $id $comment $defs definitions deprecated readOnly writeOnly";
/// Keywords the walk keeps (space-separated).
const KEYWORDS: &str =
    "type enum const properties required additionalProperties items minItems maxItems anyOf oneOf $ref";

fn listed(list: &str, k: &str) -> bool {
    list.split(' ').any(|w| w == k)
}

/// The most alternatives of one `enum` and properties of one object (a 64-bit live set).
const MAX_ALTS: usize = 64;
/// The most nodes one schema compiles to.
const MAX_NODES: usize = 4096;

/// Why a schema cannot be kept by the mask; `at` is the JSON pointer of the offending part.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A keyword outside the subset.
    #[error("at `{at}`: `{keyword}` is not supported by the JSON mask (supported: type, enum, const, properties, required, additionalProperties, items, minItems, maxItems, anyOf, oneOf, $ref)")]
    Unsupported {
        /// The JSON pointer of the schema part.
        at: String,
        /// The keyword.
        keyword: String,
    },
    /// A malformed or unsatisfiable part.
    #[error("at `{at}`: {why}")]
    Invalid {
        /// The JSON pointer of the schema part.
        at: String,
        /// What is wrong with it.
        why: String,
    },
}

fn invalid(at: &str, why: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        at: if at.is_empty() { "/".into() } else { at.into() },
        why: why.into(),
    }
}

/// One declared property: its key as written (quotes included), its value's node.
#[derive(Debug, Clone)]
pub(crate) struct Prop {
    pub key: Vec<u8>,
    pub node: u16,
    pub required: bool,
}

/// A compiled schema node.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    /// Any JSON value.
    Any,
    /// Any JSON object.
    AnyObject,
    String,
    Integer,
    Number,
    /// One of these exact encodings (`enum`, `const`, `boolean`, `null`).
    Lits(Vec<Vec<u8>>),
    /// The declared properties in order.
    Object(Vec<Prop>),
    Array {
        items: u16,
        min: u32,
        max: u32,
    },
    /// One of the branches, told apart by the value's first byte.
    OneOf(Vec<u16>),
}

/// A compiled schema: nodes and the root's index.
#[derive(Debug, Clone)]
pub struct Schema {
    pub(crate) nodes: Vec<Node>,
    pub(crate) root: u16,
}

/// Bytes that start a value: a 256-bit set.
pub(crate) type First = [u64; 4];

fn set(f: &mut First, b: u8) {
    f[b as usize / 64] |= 1 << (b % 64);
}

/// Whether `b` is in the set.
pub(crate) fn has(f: &First, b: u8) -> bool {
    f[b as usize / 64] >> (b % 64) & 1 == 1
}

fn number_first() -> First {
    let mut f = [0; 4];
    for b in b"-0123456789" {
        set(&mut f, *b);
    }
    f
}

impl Schema {
    /// Compiles `schema` (the root must be an object schema, as OpenAI requires).
    pub fn compile(schema: &Value) -> Result<Schema, SchemaError> {
        let mut c = Compiler {
            doc: schema,
            nodes: Vec::new(),
            refs: HashMap::new(),
        };
        let root = c.add(schema, "")?;
        let s = Schema {
            nodes: c.nodes,
            root,
        };
        for (i, n) in s.nodes.iter().enumerate() {
            if let Node::OneOf(b) = n {
                s.check_branches(i as u16, b)?;
            }
        }
        let mut f = [0; 4];
        s.first_into(root, &mut f, 0)
            .ok_or_else(|| invalid("", "the schema refers to itself without a value between"))?;
        if f != {
            let mut o = [0; 4];
            set(&mut o, b'{');
            o
        } {
            return Err(invalid("", "the root must be an object schema"));
        }
        Ok(s)
    }

    /// The bytes a value of `node` can start with (None: a `$ref` cycle with no value between).
    fn first_into(&self, node: u16, f: &mut First, depth: usize) -> Option<()> {
        if depth > 64 {
            return None;
        }
        match &self.nodes[node as usize] {
            Node::Any => {
                for b in b"{[\"-0123456789tfn" {
                    set(f, *b);
                }
            }
            Node::AnyObject | Node::Object(_) => set(f, b'{'),
            Node::String => set(f, b'"'),
            Node::Integer | Node::Number => {
                let n = number_first();
                (0..4).for_each(|i| f[i] |= n[i]);
            }
            Node::Lits(l) => l.iter().for_each(|l| set(f, l[0])),
            Node::Array { .. } => set(f, b'['),
            Node::OneOf(b) => {
                for &b in b {
                    self.first_into(b, f, depth + 1)?;
                }
            }
        }
        Some(())
    }

    /// The first-byte set of `node`.
    pub(crate) fn first(&self, node: u16) -> First {
        let mut f = [0; 4];
        // Checked acyclic at compile time.
        let _ = self.first_into(node, &mut f, 0);
        f
    }

    fn check_branches(&self, at: u16, branches: &[u16]) -> Result<(), SchemaError> {
        let mut seen = [0u64; 4];
        for &b in branches {
            let mut f = [0; 4];
            self.first_into(b, &mut f, 0).ok_or_else(|| {
                invalid(
                    &format!("node {at}"),
                    "a `$ref` cycle with no value between",
                )
            })?;
            if (0..4).any(|i| seen[i] & f[i] != 0) {
                return Err(invalid(
                    &format!("node {at}"),
                    "`anyOf`/`oneOf`/`type` alternatives that can start with the same character cannot be told apart by the mask (e.g. two object branches, or integer and number)",
                ));
            }
            (0..4).for_each(|i| seen[i] |= f[i]);
        }
        Ok(())
    }
}

struct Compiler<'a> {
    doc: &'a Value,
    nodes: Vec<Node>,
    refs: HashMap<String, u16>,
}

impl<'a> Compiler<'a> {
    fn push(&mut self, n: Node, at: &str) -> Result<u16, SchemaError> {
        if self.nodes.len() >= MAX_NODES {
            return Err(invalid(at, format!("more than {MAX_NODES} schema nodes")));
        }
        self.nodes.push(n);
        Ok((self.nodes.len() - 1) as u16)
    }

    /// Compiles `v` (at pointer `at`) and returns its node.
    fn add(&mut self, v: &'a Value, at: &str) -> Result<u16, SchemaError> {
        if let Some(r) = v.get("$ref") {
            if v.as_object()
                .is_some_and(|o| o.keys().any(|k| listed(KEYWORDS, k) && k != "$ref"))
            {
                return Err(invalid(at, "`$ref` beside other keywords"));
            }
            return self.reference(r, at);
        }
        let n = self.node(v, at)?;
        self.push(n, at)
    }

    fn reference(&mut self, r: &Value, at: &str) -> Result<u16, SchemaError> {
        let r = r
            .as_str()
            .ok_or_else(|| invalid(at, "`$ref` must be a string"))?;
        if let Some(&id) = self.refs.get(r) {
            return Ok(id);
        }
        let target = r
            .strip_prefix('#')
            .and_then(|p| self.doc.pointer(p))
            .ok_or_else(|| {
                invalid(
                    at,
                    format!("`$ref` `{r}` does not point into this schema (use \"#/$defs/NAME\")"),
                )
            })?;
        // Reserved before compiling the target, so that a recursive reference finds it.
        let id = self.push(Node::Any, at)?;
        self.refs.insert(r.to_string(), id);
        let inner = self.add(target, r.trim_start_matches('#'))?;
        self.nodes[id as usize] = Node::OneOf(vec![inner]);
        Ok(id)
    }

    fn node(&mut self, v: &'a Value, at: &str) -> Result<Node, SchemaError> {
        let o = match v {
            Value::Bool(true) => return Ok(Node::Any),
            Value::Bool(false) => return Err(invalid(at, "`false` allows no value")),
            Value::Object(o) => o,
            _ => return Err(invalid(at, "a schema must be an object or a boolean")),
        };
        if let Some(k) = o
            .keys()
            .find(|k| !listed(KEYWORDS, k) && !listed(ANNOTATIONS, k))
        {
            return Err(SchemaError::Unsupported {
                at: if at.is_empty() { "/".into() } else { at.into() },
                keyword: k.clone(),
            });
        }
        if let Some(c) = o.get("const") {
            return Ok(Node::Lits(vec![encode(c)]));
        }
        if let Some(e) = o.get("enum") {
            let e = e
                .as_array()
                .filter(|e| !e.is_empty() && e.len() <= MAX_ALTS)
                .ok_or_else(|| {
                    invalid(
                        at,
                        format!("`enum` must be a list of 1 to {MAX_ALTS} values"),
                    )
                })?;
            return Ok(Node::Lits(e.iter().map(encode).collect()));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(b) = o.get(key) {
                if ["type", "properties", "items"]
                    .iter()
                    .any(|k| o.contains_key(*k))
                {
                    return Err(invalid(
                        at,
                        format!("`{key}` beside type, properties or items"),
                    ));
                }
                let b = b
                    .as_array()
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| invalid(at, format!("`{key}` must be a non-empty list")))?;
                let mut ids = Vec::new();
                for (i, s) in b.iter().enumerate() {
                    ids.push(self.add(s, &format!("{at}/{key}/{i}"))?);
                }
                return Ok(Node::OneOf(ids));
            }
        }
        match o.get("type") {
            None => Ok(if o.contains_key("properties") {
                self.object(o, at)?
            } else if o.contains_key("items") {
                self.array(o, at)?
            } else {
                Node::Any
            }),
            Some(Value::String(t)) => self.typed(t, o, at),
            Some(Value::Array(ts)) if !ts.is_empty() => {
                let mut ids = Vec::new();
                for t in ts {
                    let t = t
                        .as_str()
                        .ok_or_else(|| invalid(at, "`type` entries must be strings"))?;
                    let n = self.typed(t, o, at)?;
                    ids.push(self.push(n, at)?);
                }
                Ok(Node::OneOf(ids))
            }
            Some(_) => Err(invalid(at, "`type` must be a string or a list of strings")),
        }
    }

    fn typed(
        &mut self,
        t: &str,
        o: &'a serde_json::Map<String, Value>,
        at: &str,
    ) -> Result<Node, SchemaError> {
        Ok(match t {
            "string" => Node::String,
            "integer" => Node::Integer,
            "number" => Node::Number,
            "boolean" => Node::Lits(vec![b"true".to_vec(), b"false".to_vec()]),
            "null" => Node::Lits(vec![b"null".to_vec()]),
            "object" => self.object(o, at)?,
            "array" => self.array(o, at)?,
            other => return Err(invalid(at, format!("unknown `type` `{other}`"))),
        })
    }

    fn object(
        &mut self,
        o: &'a serde_json::Map<String, Value>,
        at: &str,
    ) -> Result<Node, SchemaError> {
        let closed = o.get("additionalProperties") == Some(&Value::Bool(false));
        let required: Vec<&str> = match o.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|k| k.as_str())
                .collect::<Option<_>>()
                .ok_or_else(|| invalid(at, "`required` must list strings"))?,
            Some(_) => return Err(invalid(at, "`required` must be a list")),
        };
        let props = match o.get("properties") {
            None if required.is_empty() => {
                return Ok(match closed {
                    true => Node::Lits(vec![b"{}".to_vec()]),
                    false => Node::AnyObject,
                })
            }
            None => {
                return Err(invalid(
                    at,
                    format!("required `{}` is not among `properties`", required[0]),
                ))
            }
            Some(Value::Object(p)) => p,
            Some(_) => return Err(invalid(at, "`properties` must be an object")),
        };
        if props.len() > MAX_ALTS {
            return Err(invalid(at, format!("more than {MAX_ALTS} properties")));
        }
        if let Some(r) = required.iter().find(|r| !props.contains_key(**r)) {
            return Err(invalid(
                at,
                format!("required `{r}` is not among `properties` (the mask writes only declared properties)"),
            ));
        }
        let mut out = Vec::new();
        // Keys in name order, as the schema is shown to the model (requests keep their order:
        // harmony's tool rendering needs it).
        let mut props: Vec<(&String, &Value)> = props.iter().collect();
        props.sort_by(|a, b| a.0.cmp(b.0));
        for (k, s) in props {
            let node = self.add(s, &format!("{at}/properties/{k}"))?;
            out.push(Prop {
                key: encode(&Value::String(k.clone())),
                node,
                required: required.contains(&k.as_str()),
            });
        }
        Ok(Node::Object(out))
    }

    fn array(
        &mut self,
        o: &'a serde_json::Map<String, Value>,
        at: &str,
    ) -> Result<Node, SchemaError> {
        let count = |k: &str, d: u32| match o.get(k) {
            None => Ok(d),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| invalid(at, format!("`{k}` must be a whole number"))),
        };
        let (min, max) = (count("minItems", 0)?, count("maxItems", u32::MAX)?);
        if min > max {
            return Err(invalid(at, "`minItems` is above `maxItems`"));
        }
        let items = match o.get("items") {
            None => self.push(Node::Any, at)?,
            Some(Value::Array(_)) => {
                return Err(SchemaError::Unsupported {
                    at: format!("{at}/items"),
                    keyword: "items (a list: tuple form)".into(),
                })
            }
            Some(s) => self.add(s, &format!("{at}/items"))?,
        };
        Ok(Node::Array { items, min, max })
    }
}

/// A value's compact JSON text.
fn encode(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

#[cfg(test)]
#[path = "json_schema_tests.rs"]
mod tests;
