//! Print the OpenAPI schema of every kind (for reviewing what `kubectl explain` shows).
fn main() {
    for k in cozyplane_api::sdn_kinds()
        .into_iter()
        .chain(cozyplane_api::local_kinds())
    {
        let s = (k.schema)();
        println!("# {}/{} {}", k.group, k.version, k.kind);
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
    }
}
