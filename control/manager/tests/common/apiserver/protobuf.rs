//! Kubernetes' protobuf encoding of the objects `kubectl create namespace|secret|configmap`
//! sends (its typed clients speak protobuf to built-in kinds and do not fall back to JSON),
//! read into the JSON the rest of the stand-in keeps: the `k8s\0` envelope
//! (`runtime.Unknown`: type, raw object), then `Namespace`, `Secret` or `ConfigMap` with
//! their `ObjectMeta` (name, generateName, namespace, labels, annotations, owner references
//! refused, finalizers). The fields the server sets (uid, resourceVersion, timestamps,
//! managedFields) and a Namespace's status are passed over; any other kind or field is
//! refused, so nothing a client asks for is silently dropped.

use serde_json::{Map, Value, json};

/// One field of a protobuf message: its number and its payload.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first().ok_or("a truncated varint")?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint over 64 bits".into())
}

/// A message's fields in order (varints and length-delimited payloads only: what these
/// kinds use).
fn fields(mut buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let tag = varint(&mut buf)?;
        let field = match tag & 7 {
            0 => Field::Varint(varint(&mut buf)?),
            2 => {
                let n = usize::try_from(varint(&mut buf)?).map_err(|_| "a length")?;
                if n > buf.len() {
                    return Err("a truncated field".into());
                }
                let (payload, rest) = buf.split_at(n);
                buf = rest;
                Field::Bytes(payload)
            }
            w => return Err(format!("wire type {w} of field {}", tag >> 3)),
        };
        out.push((tag >> 3, field));
    }
    Ok(out)
}

fn bytes<'a>(f: &Field<'a>) -> Result<&'a [u8], String> {
    match f {
        Field::Bytes(b) => Ok(b),
        Field::Varint(_) => Err("a varint where bytes were wanted".into()),
    }
}

fn string(f: &Field) -> Result<String, String> {
    String::from_utf8(bytes(f)?.to_vec()).map_err(|_| "a string that is not UTF-8".into())
}

/// A `map<string, V>` entry: (key, value's field).
fn entry<'a>(f: &Field<'a>) -> Result<(String, Field<'a>), String> {
    let mut key = String::new();
    let mut value = Field::Bytes(&[]);
    for (n, f) in fields(bytes(f)?)? {
        match n {
            1 => key = string(&f)?,
            2 => value = f,
            _ => return Err(format!("map entry field {n}")),
        }
    }
    Ok((key, value))
}

/// Base64 (standard, padded), as JSON carries a Secret's bytes.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn metadata(buf: &[u8]) -> Result<Value, String> {
    let mut m = Map::new();
    for (n, f) in fields(buf)? {
        let name = match n {
            1 => "name",
            2 => "generateName",
            3 => "namespace",
            11 | 12 => {
                let (k, v) = entry(&f)?;
                let map = if n == 11 { "labels" } else { "annotations" };
                m.entry(map).or_insert(json!({}))[k] = json!(string(&v)?);
                continue;
            }
            14 => {
                let finalizer = json!(string(&f)?);
                if let Some(list) = m.entry("finalizers").or_insert(json!([])).as_array_mut() {
                    list.push(finalizer);
                }
                continue;
            }
            // What a create carries empty or the server sets (uid, resourceVersion, ...).
            4..=10 | 15..=17 => continue,
            _ => return Err(format!("ObjectMeta field {n}")),
        };
        m.insert(name.into(), json!(string(&f)?));
    }
    Ok(Value::Object(m))
}

/// The object in a `k8s\0`-framed protobuf body, as JSON.
pub(super) fn decode(body: &[u8]) -> Result<Value, String> {
    let unknown = body.strip_prefix(b"k8s\0").ok_or("no k8s protobuf envelope")?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, f) in fields(unknown)? {
        match n {
            1 => {
                for (n, f) in fields(bytes(&f)?)? {
                    match n {
                        1 => api_version = string(&f)?,
                        2 => kind = string(&f)?,
                        _ => {}
                    }
                }
            }
            2 => raw = bytes(&f)?,
            _ => {}
        }
    }
    let mut object = json!({"apiVersion": api_version, "kind": kind});
    for (n, f) in fields(raw)? {
        match (kind.as_str(), n) {
            (_, 1) => object["metadata"] = metadata(bytes(&f)?)?,
            ("Namespace", 2) => {
                for (n, f) in fields(bytes(&f)?)? {
                    if n != 1 {
                        return Err(format!("NamespaceSpec field {n}"));
                    }
                    let mut list =
                        object["spec"]["finalizers"].as_array().cloned().unwrap_or_default();
                    list.push(json!(string(&f)?));
                    object["spec"]["finalizers"] = json!(list);
                }
            }
            ("Namespace", 3) => {}
            ("Secret", 2) | ("ConfigMap", 3) => {
                let (k, v) = entry(&f)?;
                let field = if kind == "Secret" { "data" } else { "binaryData" };
                object[field][k] = json!(base64(bytes(&v)?));
            }
            ("Secret", 4) | ("ConfigMap", 2) => {
                let (k, v) = entry(&f)?;
                let field = if kind == "Secret" { "stringData" } else { "data" };
                object[field][k] = json!(string(&v)?);
            }
            ("Secret", 3) => object["type"] = json!(string(&f)?),
            ("Secret", 5) | ("ConfigMap", 4) => {
                object["immutable"] = json!(matches!(f, Field::Varint(v) if v != 0));
            }
            _ => {
                return Err(format!(
                    "{kind} field {n} (the stand-in reads Namespace, Secret and ConfigMap)"
                ));
            }
        }
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_pads_as_the_standard_says() {
        assert_eq!(super::base64(b"abc"), "YWJj");
        assert_eq!(super::base64(b"ab"), "YWI=");
        assert_eq!(super::base64(b"a"), "YQ==");
    }
}
