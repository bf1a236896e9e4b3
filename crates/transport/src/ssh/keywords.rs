//! What the built-in client does with each ssh_config keyword.
//!
//! Every keyword OpenSSH's client knows is listed here with what the built-in client makes
//! of it: it reads it, it passes it over (the keyword only matters to an interactive ssh, or
//! it only loosens or reports what the built-in client checks in any case), or only the
//! system ssh honours it. A keyword not listed here is one a newer ssh may know: it is left
//! to the system ssh too, which honours it or refuses it, as scp would. Nothing that could
//! make a connection less safe than ssh's is dropped in silence.

/// What the built-in client does with one ssh_config keyword and its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeywordUse {
    /// Read and honoured.
    Read,
    /// Passed over: a copy needs nothing of it (forwarding, a terminal, log levels), or it
    /// only loosens or reports what the built-in client checks all the same. `fastcp -v`
    /// names each.
    PassedOver,
    /// Only the system ssh honours it: the connection is handed to it.
    SystemSsh,
    /// A keyword this list lacks, which a newer ssh may know: the connection is handed to
    /// the system ssh, unless ssh_config's `IgnoreUnknown` names it.
    Unknown,
}

/// Read and honoured by the built-in client, or checked where it is read (ControlMaster,
/// GSSAPIAuthentication, BindAddress, ... hand the connection to the system ssh there, by
/// their value).
const READ: &[&str] = &[
    "host",
    "match",
    "include",
    "ignoreunknown",
    "hostname",
    "port",
    "user",
    "addressfamily",
    "identityfile",
    "identitiesonly",
    "identityagent",
    "certificatefile",
    "proxyjump",
    "proxycommand",
    "stricthostkeychecking",
    "userknownhostsfile",
    "globalknownhostsfile",
    "hashknownhosts",
    "hostkeyalias",
    "revokedhostkeys",
    "connecttimeout",
    "batchmode",
    "passwordauthentication",
    "pubkeyauthentication",
    "kbdinteractiveauthentication",
    "challengeresponseauthentication",
    "numberofpasswordprompts",
    "preferredauthentications",
    "pubkeyacceptedalgorithms",
    "pubkeyacceptedkeytypes",
    "requiredrsasize",
    "serveraliveinterval",
    "serveralivecountmax",
    "ciphers",
    "kexalgorithms",
    "macs",
    "hostkeyalgorithms",
    "pkcs11provider",
    "smartcarddevice",
    "securitykeyprovider",
    "knownhostscommand",
    "bindaddress",
    "bindinterface",
    "canonicalizehostname",
    "controlmaster",
    "controlpath",
    "gssapiauthentication",
];

/// Passed over whatever their value: what an interactive session, forwarding or logging
/// use; what only loosens host key checks the built-in client makes in full
/// (NoHostAuthenticationForLocalhost) or adds warnings to them (CheckHostIP); what tunes
/// the connection (TCPKeepAlive: the built-in client sets its own keepalives); what only
/// matters with a key exchange, a host certificate or a canonical name the built-in client
/// never uses; and keywords ssh itself ignores as deprecated.
const PASSED_OVER: &[&str] = &[
    // The session, the terminal, forwarding.
    "addkeystoagent",
    "forwardagent",
    "forwardx11",
    "forwardx11timeout",
    "forwardx11trusted",
    "xauthlocation",
    "localforward",
    "remoteforward",
    "dynamicforward",
    "clearallforwardings",
    "exitonforwardfailure",
    "gatewayports",
    "permitremoteopen",
    "streamlocalbindmask",
    "streamlocalbindunlink",
    "tunnel",
    "tunneldevice",
    "permitlocalcommand",
    "localcommand",
    "remotecommand",
    "requesttty",
    "sessiontype",
    "stdinnull",
    "forkafterauthentication",
    "escapechar",
    "enableescapecommandline",
    "obscurekeystroketiming",
    "channeltimeout",
    "controlpersist",
    "sendenv",
    "setenv",
    // What is said, not what is done.
    "loglevel",
    "logverbose",
    "syslogfacility",
    "visualhostkey",
    "fingerprinthash",
    "warnweakcrypto",
    "checkhostip",
    "tag",
    // Tuning.
    "compression",
    "tcpkeepalive",
    "connectionattempts",
    "ipqos",
    "rekeylimit",
    "usekeychain",
    // Loosening only: the built-in client checks every host key against known_hosts.
    "nohostauthenticationforlocalhost",
    "updatehostkeys",
    // Certificates, canonical names and GSSAPI, which the built-in client never uses.
    "casignaturealgorithms",
    "canonicaldomains",
    "canonicalizefallbacklocal",
    "canonicalizemaxdots",
    "canonicalizepermittedcnames",
    "gssapiclientidentity",
    "gssapiserveridentity",
    "gssapidelegatecredentials",
    "gssapikeyexchange",
    "gssapikexalgorithms",
    "gssapirenewalforcesrekey",
    "gssapitrustdns",
    "hostbasedacceptedalgorithms",
    "hostbasedkeytypes",
    "enablesshkeysign",
    "kbdinteractivedevices",
    // Deprecated or unsupported: ssh ignores them too.
    "cipher",
    "protocol",
    "useroaming",
    "rsaauthentication",
    "rhostsrsaauthentication",
    "compressionlevel",
    "useprivilegedport",
    "fallbacktorsh",
    "usersh",
    "keepalive",
    "afstokenpassing",
    "kerberosauthentication",
    "kerberostgtpassing",
    "globalknownhostsfile2",
    "userknownhostsfile2",
];

/// Only the system ssh does what these ask, unless their value turns them off: trusting
/// host keys from DNS, host-based logins, a proxy that passes a connected socket, and
/// refusing the connection outright.
const SYSTEM_SSH_UNLESS_OFF: &[&str] = &[
    "verifyhostkeydns",
    "hostbasedauthentication",
    "proxyusefdpass",
    "refuseconnection",
];

/// What the built-in client does with `keyword` (any case) set to `value`.
pub(crate) fn keyword_use(keyword: &str, value: &str) -> KeywordUse {
    let keyword = keyword.to_ascii_lowercase();
    let keyword = keyword.as_str();
    if READ.contains(&keyword) {
        KeywordUse::Read
    } else if PASSED_OVER.contains(&keyword) {
        KeywordUse::PassedOver
    } else if SYSTEM_SSH_UNLESS_OFF.contains(&keyword) {
        let first = value.split_whitespace().next().unwrap_or_default();
        if ["no", "false"]
            .iter()
            .any(|v| first.eq_ignore_ascii_case(v))
        {
            KeywordUse::PassedOver
        } else {
            KeywordUse::SystemSsh
        }
    } else {
        KeywordUse::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_keyword_has_one_use() {
        for list in [READ, PASSED_OVER, SYSTEM_SSH_UNLESS_OFF] {
            for k in list {
                let lists = [READ, PASSED_OVER, SYSTEM_SSH_UNLESS_OFF];
                let n = lists.iter().filter(|l| l.contains(k)).count();
                assert_eq!(n, 1, "{k}");
                assert_eq!(*k, k.to_ascii_lowercase(), "{k}");
            }
        }
        assert_eq!(keyword_use("HostName", "example.org"), KeywordUse::Read);
        assert_eq!(keyword_use("SendEnv", "LANG"), KeywordUse::PassedOver);
        assert_eq!(
            keyword_use("VerifyHostKeyDNS", "yes"),
            KeywordUse::SystemSsh
        );
        assert_eq!(
            keyword_use("VerifyHostKeyDNS", "no"),
            KeywordUse::PassedOver
        );
        assert_eq!(keyword_use("SomeNewKeyword", "1"), KeywordUse::Unknown);
        assert_eq!(
            keyword_use("REFUSECONNECTION", "yes"),
            KeywordUse::SystemSsh
        );
        assert_eq!(keyword_use("ProxyUseFdpass", "no"), KeywordUse::PassedOver);
    }
}
