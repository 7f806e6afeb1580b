//! YAML as Knitter's programs read and write it (`knitterctl apply -f`, `-o yaml`, the node
//! daemon's topology documents): serde-saphyr, a YAML parser in safe Rust with limits on
//! aliases and nesting (a hostile document cannot blow up the daemon's memory), read under
//! YAML 1.2's core schema as the YAML documents of Kubernetes and serde_yaml have it: only
//! `true`/`false` are booleans (`n`, `no`, `on` are strings), and `0755` or `1_000` stay
//! strings where the type is not given.

use serde::{Serialize, de::DeserializeOwned};

pub use serde_saphyr::{Error, SerializeError};

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
    }
}

/// One YAML document.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// Every document of a stream (`---` between them), as Kubernetes manifests come.
pub fn from_multiple<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, Error> {
    serde_saphyr::from_multiple_with_options(text, options())
}

/// `value` as a YAML document.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, SerializeError> {
    serde_saphyr::to_string(value)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    /// What YAML 1.1 would have made booleans and octal numbers stay text; the words
    /// YAML 1.2 keeps for booleans and null are still theirs.
    #[test]
    fn yaml_1_2_core_schema() {
        let v: Value =
            super::from_str("a: n\nb: yes\nc: on\nd: 0755\ne: 1_000\nf: true\ng: null\nh: 42\n")
                .unwrap();
        assert_eq!(
            v,
            json!({"a": "n", "b": "yes", "c": "on", "d": "0755", "e": "1_000", "f": true, "g": null, "h": 42})
        );
        let back: Value = super::from_str(&super::to_string(&v).unwrap()).unwrap();
        assert_eq!(back, v, "what is written reads back the same");
        let docs: Vec<Value> = super::from_multiple("a: 1\n---\nb: 2\n").unwrap();
        assert_eq!(docs, vec![json!({"a": 1}), json!({"b": 2})]);
    }

    /// A socket's mode written with a leading zero (`0660`: octal to a person, YAML 1.1 and
    /// Kubernetes; decimal 660 to YAML 1.2) is refused, never read as the other number;
    /// `0o660` is the octal one.
    #[test]
    fn a_leading_zero_number_is_refused_where_a_number_is_wanted() {
        #[derive(serde::Deserialize)]
        struct Socket {
            mode: u32,
        }
        assert!(super::from_str::<Socket>("mode: 0660").is_err());
        assert_eq!(super::from_str::<Socket>("mode: 0o660").unwrap().mode, 0o660);
    }

    /// An alias bomb (each level doubles the last) is refused, not expanded.
    #[test]
    fn an_alias_bomb_is_refused() {
        let mut doc = String::from("a0: &a0 [x, x]\n");
        for i in 1..40 {
            doc += &format!("a{i}: &a{i} [*a{}, *a{}]\n", i - 1, i - 1);
        }
        assert!(super::from_str::<Value>(&doc).is_err());
    }
}
