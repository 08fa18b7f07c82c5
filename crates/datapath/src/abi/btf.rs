//! A minimal reader of the `.BTF` section of the compiled object, for the
//! ABI tests in [`super::object_check`]: named structs with their members'
//! offsets and sizes, and enums with their enumerators.
//!
//! Why not aya-obj's BTF parser: it parses the same section, but keeps the
//! members, enumerators and names of its types crate-private, so the layout
//! cannot be read through it. The format is small and stable (the kernel's
//! `Documentation/bpf/btf.rst`); this reads only what the tests compare and
//! panics with the reason on anything malformed (test code).

const MAGIC: u16 = 0xeb9f;

// BTF_KIND_* (include/uapi/linux/btf.h).
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One member of a struct or union.
#[derive(Clone, Debug)]
pub(super) struct Member {
    pub name: String,
    /// Byte offset in the struct.
    pub offset: usize,
    /// Type id of the member.
    pub type_id: u32,
}

#[derive(Clone, Debug)]
enum Type {
    /// INT, FLOAT: a scalar of `size` bytes.
    Scalar {
        size: usize,
    },
    /// PTR: 8 bytes on BPF.
    Ptr,
    Array {
        elem: u32,
        len: usize,
    },
    /// STRUCT and UNION.
    Composite {
        name: String,
        size: usize,
        members: Vec<Member>,
    },
    /// ENUM and ENUM64.
    Enum {
        name: String,
        size: usize,
        values: Vec<(String, i128)>,
    },
    /// TYPEDEF, CONST, VOLATILE, RESTRICT, TYPE_TAG: the type they qualify.
    Alias(u32),
    /// Everything the tests never look into (FWD, FUNC, VAR, DATASEC, ...).
    Other,
}

/// The parsed type section. Type ids start at 1 (0 is `void`).
pub(super) struct Btf {
    types: Vec<Type>,
}

/// A struct or union of the object.
pub(super) struct Struct<'a> {
    pub size: usize,
    pub members: &'a [Member],
}

/// An enum of the object.
pub(super) struct Enum<'a> {
    pub name: &'a str,
    pub values: &'a [(String, i128)],
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> u32 {
        let bytes = self
            .data
            .get(self.pos..self.pos + 4)
            .unwrap_or_else(|| panic!("BTF truncated at byte {}", self.pos));
        self.pos += 4;
        u32::from_le_bytes(bytes.try_into().expect("4 bytes"))
    }

    fn skip(&mut self, words: usize) {
        for _ in 0..words {
            self.u32();
        }
    }
}

impl Btf {
    /// Parse a little-endian `.BTF` section (`-target bpf` on x86_64).
    pub(super) fn parse(section: &[u8]) -> Self {
        let magic = u16::from_le_bytes([section[0], section[1]]);
        assert_eq!(magic, MAGIC, "not little-endian BTF (magic {magic:#x})");
        let mut hdr = Reader {
            data: section,
            pos: 4,
        };
        let hdr_len = hdr.u32() as usize;
        let (type_off, type_len) = (hdr.u32() as usize, hdr.u32() as usize);
        let (str_off, str_len) = (hdr.u32() as usize, hdr.u32() as usize);
        let body = &section[hdr_len..];
        let strings = &body[str_off..str_off + str_len];
        let name = |off: u32| -> String {
            let s = &strings[off as usize..];
            let end = s.iter().position(|&b| b == 0).expect("NUL-terminated name");
            String::from_utf8_lossy(&s[..end]).into_owned()
        };

        let mut r = Reader {
            data: &body[type_off..type_off + type_len],
            pos: 0,
        };
        let mut types = vec![Type::Other]; // id 0: void
        while r.pos < r.data.len() {
            let name_off = r.u32();
            let info = r.u32();
            let size_or_type = r.u32();
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let t = match kind {
                KIND_INT => {
                    r.skip(1);
                    Type::Scalar {
                        size: size_or_type as usize,
                    }
                }
                KIND_FLOAT => Type::Scalar {
                    size: size_or_type as usize,
                },
                KIND_PTR => Type::Ptr,
                KIND_ARRAY => {
                    let elem = r.u32();
                    let _index_type = r.u32();
                    let len = r.u32() as usize;
                    Type::Array { elem, len }
                }
                KIND_STRUCT | KIND_UNION => {
                    let members = (0..vlen)
                        .map(|_| {
                            let name = name(r.u32());
                            let type_id = r.u32();
                            let offset = r.u32();
                            // With kind_flag, the low 24 bits are the bit
                            // offset and the high 8 a bitfield size.
                            let bits = if kind_flag {
                                offset & 0xff_ffff
                            } else {
                                offset
                            };
                            Member {
                                name,
                                offset: bits as usize / 8,
                                type_id,
                            }
                        })
                        .collect();
                    Type::Composite {
                        name: name(name_off),
                        size: size_or_type as usize,
                        members,
                    }
                }
                KIND_ENUM => {
                    let values = (0..vlen)
                        .map(|_| {
                            let n = name(r.u32());
                            let raw = r.u32();
                            // kind_flag: signed values.
                            let v = if kind_flag {
                                i128::from(raw as i32)
                            } else {
                                i128::from(raw)
                            };
                            (n, v)
                        })
                        .collect();
                    Type::Enum {
                        name: name(name_off),
                        size: size_or_type as usize,
                        values,
                    }
                }
                KIND_ENUM64 => {
                    let values = (0..vlen)
                        .map(|_| {
                            let n = name(r.u32());
                            let lo = u64::from(r.u32());
                            let hi = u64::from(r.u32());
                            let raw = hi << 32 | lo;
                            let v = if kind_flag {
                                i128::from(raw as i64)
                            } else {
                                i128::from(raw)
                            };
                            (n, v)
                        })
                        .collect();
                    Type::Enum {
                        name: name(name_off),
                        size: size_or_type as usize,
                        values,
                    }
                }
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    Type::Alias(size_or_type)
                }
                KIND_FWD | KIND_FUNC => Type::Other,
                KIND_FUNC_PROTO => {
                    r.skip(2 * vlen);
                    Type::Other
                }
                KIND_VAR | KIND_DECL_TAG => {
                    r.skip(1);
                    Type::Other
                }
                KIND_DATASEC => {
                    r.skip(3 * vlen);
                    Type::Other
                }
                other => panic!("BTF kind {other} unknown to this reader"),
            };
            types.push(t);
        }
        Self { types }
    }

    fn get(&self, id: u32) -> &Type {
        self.types
            .get(id as usize)
            .unwrap_or_else(|| panic!("BTF type id {id} out of range"))
    }

    /// The named struct (or union) `name`, if the object has it.
    pub(super) fn find_struct(&self, name: &str) -> Option<Struct<'_>> {
        self.types.iter().find_map(|t| match t {
            Type::Composite {
                name: n,
                size,
                members,
            } if n == name => Some(Struct {
                size: *size,
                members,
            }),
            _ => None,
        })
    }

    /// The name of the struct or union type `id` resolves to (through
    /// typedefs and qualifiers), if it is one.
    pub(super) fn struct_name(&self, id: u32) -> Option<&str> {
        match self.get(self.resolve(id)) {
            Type::Composite { name, .. } => Some(name),
            _ => None,
        }
    }

    /// The enum type `id` resolves to, if it is one.
    pub(super) fn enum_of(&self, id: u32) -> Option<Enum<'_>> {
        match self.get(self.resolve(id)) {
            Type::Enum { name, values, .. } => Some(Enum { name, values }),
            _ => None,
        }
    }

    fn resolve(&self, mut id: u32) -> u32 {
        while let Type::Alias(target) = self.get(id) {
            id = *target;
        }
        id
    }

    /// Size in bytes of type `id`.
    pub(super) fn size_of(&self, id: u32) -> usize {
        match self.get(self.resolve(id)) {
            Type::Scalar { size } | Type::Composite { size, .. } | Type::Enum { size, .. } => *size,
            Type::Ptr => 8,
            Type::Array { elem, len } => self.size_of(*elem) * len,
            Type::Alias(_) | Type::Other => panic!("BTF type id {id} has no size"),
        }
    }
}
