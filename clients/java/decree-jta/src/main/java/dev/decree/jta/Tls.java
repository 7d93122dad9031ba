package dev.decree.jta;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/** TLS settings for {@code tls:} endpoints from PEM files, as the server's operator hands them out (docs/protocol.md, "TLS"). */
public final class Tls {
    private Tls() {}

    /**
     * A TLS 1.3 context that trusts the CA certificates in {@code caPem} and presents the
     * certificate chain {@code certPem} with its private key {@code keyPem} (PKCS#8, "BEGIN
     * PRIVATE KEY"; RSA, EC or Ed25519).
     */
    public static SSLContext context(Path caPem, Path certPem, Path keyPem) {
        try {
            CertificateFactory cf = CertificateFactory.getInstance("X.509");
            KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
            trust.load(null, null);
            int i = 0;
            for (Certificate c : cf.generateCertificates(new ByteArrayInputStream(Files.readAllBytes(caPem)))) {
                trust.setCertificateEntry("ca" + i++, c);
            }
            Collection<? extends Certificate> chain = cf.generateCertificates(new ByteArrayInputStream(Files.readAllBytes(certPem)));
            PrivateKey key = privateKey(Files.readString(keyPem, StandardCharsets.US_ASCII));
            KeyStore keys = KeyStore.getInstance(KeyStore.getDefaultType());
            keys.load(null, null);
            char[] pw = new char[0];
            keys.setKeyEntry("client", key, pw, chain.toArray(new Certificate[0]));
            KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
            kmf.init(keys, pw);
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(trust);
            SSLContext ctx = SSLContext.getInstance("TLSv1.3");
            ctx.init(kmf.getKeyManagers(), tmf.getTrustManagers(), null);
            return ctx;
        } catch (IOException | GeneralSecurityException e) {
            throw new IllegalArgumentException("cannot load TLS files (" + caPem + ", " + certPem + ", " + keyPem + "): " + e, e);
        }
    }

    static PrivateKey privateKey(String pem) throws GeneralSecurityException {
        String begin = "-----BEGIN PRIVATE KEY-----";
        int a = pem.indexOf(begin);
        int b = pem.indexOf("-----END PRIVATE KEY-----");
        if (a < 0 || b < 0) {
            throw new GeneralSecurityException("the key is not PKCS#8 PEM (BEGIN PRIVATE KEY); convert it with openssl pkcs8 -topk8 -nocrypt");
        }
        byte[] der = Base64.getMimeDecoder().decode(pem.substring(a + begin.length(), b));
        List<String> tried = new ArrayList<>();
        for (String alg : new String[] {"RSA", "EC", "Ed25519", "EdDSA"}) {
            try {
                return KeyFactory.getInstance(alg).generatePrivate(new PKCS8EncodedKeySpec(der));
            } catch (GeneralSecurityException e) {
                tried.add(alg);
            }
        }
        throw new GeneralSecurityException("the key is none of " + tried);
    }
}
