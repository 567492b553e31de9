// A real OpenID Connect provider for the single sign-on tests: node's oidc-provider (installed under .node/ by
// `make oidc-provider`), one confidential client, an RSA signing key made at start. Its users, their e-mail and
// groups, are read from USERS_FILE at every look-up, so a test changes a user's groups between two sign-ins.
// Sign-in is the package's own development form (any password); consent is granted to our one client up front, as a
// company's provider does for its own applications. Started and stopped by tests/support/oidc_provider.py.
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const env = process.env;
const { default: Provider } = await import(pathToFileURL(join(env.OIDC_PROVIDER_PACKAGE, 'lib/index.js')).href);

const users = () => JSON.parse(readFileSync(env.USERS_FILE, 'utf8'));
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });

const provider = new Provider(env.ISSUER, {
  clients: [{
    client_id: env.CLIENT_ID,
    client_secret: env.CLIENT_SECRET,
    redirect_uris: [env.REDIRECT_URI],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  jwks: { keys: [{ ...privateKey.export({ format: 'jwk' }), kid: 'sso-test', use: 'sig', alg: 'RS256' }] },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  cookies: { keys: [randomBytes(32).toString('hex')] },
  async findAccount(ctx, sub) {
    const user = users()[sub];
    if (!user) return undefined;
    return { accountId: sub, async claims() { return { sub, ...user }; } };
  },
  async loadExistingGrant(ctx) {
    const { client, session, params } = ctx.oidc;
    const grantId = ctx.oidc.result?.consent?.grantId || session.grantIdFor(client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: client.clientId, accountId: session.accountId });
    grant.addOIDCScope(params.scope);
    await grant.save();
    return grant;
  },
});

provider.listen(Number(env.PORT), '127.0.0.1', () => console.log(`listening on ${env.ISSUER}`));
