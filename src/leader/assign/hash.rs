//! The hash behind every score and every shard. Every member of a group must compute the same scores, whatever
//! its platform, Rust version or process (std's `DefaultHasher` is keyed at random per process and may change
//! between releases), so it is spelled out here: FNV-1a 64 over the bytes, then the splitmix64 finalizer, because
//! FNV-1a alone mixes its last bytes poorly into the high bits the score uses. Changing any of it moves names
//! between replicas running different versions: the tests pin its values.

pub(super) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Between the member and the name in a pair hash. 0xff never occurs in UTF-8, so ("ab", "c") and ("a", "bc")
/// hash different byte strings.
const SEPARATOR: u8 = 0xff;

pub(super) fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        state ^= u64::from(byte);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

pub(super) fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The FNV-1a state after `member bytes, 0xff`: where every pair hash of the member starts.
pub(super) fn pair_prefix(member: &str) -> u64 {
    fnv1a(fnv1a(FNV_OFFSET, member.as_bytes()), &[SEPARATOR])
}

/// The hash of a (member, name) pair from the member's [`pair_prefix`]: FNV-1a over `member bytes, 0xff,
/// name bytes`, then splitmix64.
pub(super) fn pair_hash(prefix: u64, name: &str) -> u64 {
    splitmix64(fnv1a(prefix, name.as_bytes()))
}

/// The hash of one string alone: a member name for the quota tie-break, a work key for [`shard_of`].
pub(super) fn str_hash(text: &str) -> u64 {
    splitmix64(fnv1a(FNV_OFFSET, text.as_bytes()))
}

/// The shard, in `0..count`, that work keyed by `key` belongs to: every replica computes the same, whatever its
/// platform, Rust version or process. A `count` of 0 is read as 1.
///
/// Jump consistent hashing (Lamping and Veach, 2014) over a stable hash of the key: the keys spread evenly over
/// the shards, and when `count` grows from `n` to `n + 1` only about `1/(n + 1)` of them move, all to the new
/// shard `n` (a key never moves between two shards that exist in both configurations).
///
/// ```
/// use pgfence::leader::shard_of;
///
/// let shard = shard_of("customer-42", 8);
/// assert!(shard < 8);
/// // One more shard: the key stays, or moves to the new one.
/// assert!([shard, 8].contains(&shard_of("customer-42", 9)));
/// ```
pub fn shard_of(key: &str, count: u32) -> u32 {
    let buckets = i64::from(count.max(1));
    let mut state = str_hash(key);
    let (mut bucket, mut next) = (0i64, 0i64);
    // Each step draws the next bucket at which the key would jump; the arithmetic is exact integer-to-float
    // conversions, one IEEE division and one multiplication (correctly rounded everywhere) and a truncation.
    while next < buckets {
        bucket = next;
        state = state
            .wrapping_mul(2_862_933_555_777_941_757)
            .wrapping_add(1);
        next = ((bucket + 1) as f64 * ((1u64 << 31) as f64 / ((state >> 33) + 1) as f64)) as i64;
    }
    // Below `count`, so it fits.
    bucket as u32
}

/// `-weight / ln(u)` with `u = ((hash >> 11) + 0.5) / 2^53`: with `u` uniform on (0, 1), `-ln(u) / weight` is
/// exponential with rate `weight`, the smallest of such independent variables is a given member's with
/// probability proportional to its weight, and the score is its inverse: the highest score wins a name in
/// proportion to the weight. The 53 high bits fill an f64 mantissa exactly; the half keeps `u` off 0, and the
/// only value at which the sum rounds up to 2^53 (u = 1) gives −∞, the lowest score, never NaN.
pub(super) fn weighted_score(weight: u64, hash: u64) -> f64 {
    const TWO_POW_53: f64 = 9_007_199_254_740_992.0;
    let u = ((hash >> 11) as f64 + 0.5) / TWO_POW_53;
    -(weight as f64) / ln(u)
}

/// The natural logarithm of a positive normal `x`, computed with additions, multiplications and divisions only
/// (fdlibm's `log`, as in FreeBSD and musl): each of those is correctly rounded by IEEE 754 on every platform,
/// whereas `f64::ln` calls the platform's math library, whose last bit is documented to vary. A difference of one
/// bit could reorder two close scores and make two members disagree about an owner. Accurate to under 1 ulp.
fn ln(x: f64) -> f64 {
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const LG1: f64 = f64::from_bits(0x3fe5_5555_5555_5593);
    const LG2: f64 = f64::from_bits(0x3fd9_9999_9997_fa04);
    const LG3: f64 = f64::from_bits(0x3fd2_4924_9422_9359);
    const LG4: f64 = f64::from_bits(0x3fcc_71c5_1d8e_78af);
    const LG5: f64 = f64::from_bits(0x3fc7_4664_96cb_03de);
    const LG6: f64 = f64::from_bits(0x3fc3_9a09_d078_c69f);
    const LG7: f64 = f64::from_bits(0x3fc2_f112_df3e_5244);
    debug_assert!(x.is_normal() && x > 0.0, "ln of {x}");
    if x == 1.0 {
        return 0.0;
    }
    let bits = x.to_bits();
    // Reduce x to 2^k · (1 + f) with 1 + f in [sqrt(2)/2, sqrt(2)).
    let mut high = (bits >> 32) as u32;
    high = high.wrapping_add(0x3ff0_0000 - 0x3fe6_a09e);
    let k = (high >> 20) as i32 - 0x3ff;
    high = (high & 0x000f_ffff) + 0x3fe6_a09e;
    let reduced = f64::from_bits((u64::from(high) << 32) | (bits & 0xffff_ffff));
    let f = reduced - 1.0;
    let hfsq = 0.5 * f * f;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (LG2 + w * (LG4 + w * LG6));
    let t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)));
    let r = t2 + t1;
    let dk = f64::from(k);
    s * (hfsq + r) + dk * LN2_LO - hfsq + f + dk * LN2_HI
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_score_is_finite_positive_and_ordered_by_weight() {
        // Invariant: no NaN, and a heavier member scores a name higher than a lighter one with the same hash.
        for hash in [0, 1, 1 << 11, u64::MAX >> 1, u64::MAX - (1 << 11), u64::MAX] {
            let light = weighted_score(1, hash);
            let heavy = weighted_score(2, hash);
            assert!(!light.is_nan() && !heavy.is_nan());
            if light.is_finite() {
                assert!(light > 0.0 && heavy > light, "{hash:#x}");
            }
        }
        // The one hash whose u rounds to 1 gets the lowest score, not NaN.
        assert_eq!(weighted_score(1, u64::MAX), f64::NEG_INFINITY);
    }

    #[test]
    fn the_portable_logarithm_agrees_with_the_platform_one() {
        // Invariant: `ln` is the natural logarithm (within 1 ulp of the platform's) over the scores' domain.
        let mut state = 0x1234_5678_9abc_def0_u64;
        let ulp = |x: f64| f64::from_bits(x.abs().to_bits() + 1) - x.abs();
        for _ in 0..20_000 {
            state = splitmix64(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
            let u = ((state >> 11) as f64 + 0.5) / 9_007_199_254_740_992.0;
            let (ours, std) = (ln(u), u.ln());
            assert!(
                (ours - std).abs() <= ulp(std),
                "ln({u:e}) = {ours:e}, std {std:e}"
            );
        }
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(ln(0.5), -std::f64::consts::LN_2);
        assert_eq!(ln(0.25), -2.0 * std::f64::consts::LN_2);
        assert_eq!(ln(f64::MIN_POSITIVE), -708.3964185322641);
    }

    #[test]
    fn shard_of_is_stable_in_range_and_pinned() {
        // Invariant: shard_of stays in 0..count (0 read as 1) and never changes (pinned values).
        for key in ["", "a", "customer-42", "ünïcödé"] {
            assert_eq!(shard_of(key, 0), 0);
            assert_eq!(shard_of(key, 1), 0);
            for count in [2, 3, 7, 64, 1024, u32::MAX] {
                assert!(shard_of(key, count) < count);
            }
        }
        let pinned: Vec<u32> = ["", "a", "customer-42", "order/7"]
            .iter()
            .map(|k| shard_of(k, 1024))
            .collect();
        assert_eq!(pinned, PINNED_SHARDS);
        assert_eq!(str_hash("customer-42"), PINNED_KEY_HASH);
    }

    const PINNED_SHARDS: [u32; 4] = [978, 572, 882, 674];
    const PINNED_KEY_HASH: u64 = 0xe02a_9217_8bcc_fd76;

    #[test]
    fn shard_of_spreads_keys_evenly_and_moves_them_only_to_a_new_shard() {
        // Invariant: keys spread evenly, and one more shard moves only about 1/(n + 1) of them, all to it.
        let keys: Vec<String> = (0..8000).map(|i| format!("key-{i}")).collect();
        for count in 1..=12u32 {
            let mut per_shard = vec![0usize; count as usize];
            let mut moved = 0usize;
            for key in &keys {
                let before = shard_of(key, count);
                per_shard[before as usize] += 1;
                let after = shard_of(key, count + 1);
                if after != before {
                    assert_eq!(after, count, "{key} moved from {before} to {after}");
                    moved += 1;
                }
            }
            let even = keys.len() / count as usize;
            assert!(
                per_shard.iter().all(|&c| c.abs_diff(even) < even / 5 + 50),
                "{per_shard:?}"
            );
            let expected = keys.len() / (count as usize + 1);
            assert!(
                moved.abs_diff(expected) < expected / 5 + 50,
                "{count}: {moved} moved"
            );
        }
    }
}
