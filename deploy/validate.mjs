// Validates rendered Kubernetes manifests (multi-document YAML on stdin, as `kubectl
// kustomize` prints them): every object against the Kubernetes OpenAPI schema of its kind
// with kubernetes-models, then shardcoord's own rules for them. Prints one line per object;
// exits 1 naming every problem. Used by deploy/check.sh.
//
//   kubectl kustomize deploy/k8s/overlays/gpu | node deploy/validate.mjs gpu
import { parseAllDocuments } from "yaml";

const overlay = process.argv[2] ?? "stdin";
const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const docs = parseAllDocuments(Buffer.concat(chunks).toString("utf8"));

const problems = [];
const objects = [];
for (const doc of docs) {
  if (doc.errors.length) {
    problems.push(`YAML: ${doc.errors.map((e) => e.message).join("; ")}`);
    continue;
  }
  const obj = doc.toJSON();
  if (obj) objects.push(obj);
}

// The kubernetes-models module of an apiVersion: "apps/v1" -> kubernetes-models/apps/v1,
// "v1" -> kubernetes-models/v1.
async function modelClass(apiVersion, kind) {
  try {
    const mod = await import(`kubernetes-models/${apiVersion}`);
    return mod[kind];
  } catch {
    return undefined;
  }
}

const name = (o) => `${o.kind}/${o.metadata?.name}`;
for (const obj of objects) {
  const Model = await modelClass(obj.apiVersion, obj.kind);
  if (!Model) {
    problems.push(`${name(obj)}: no schema for ${obj.apiVersion} ${obj.kind}`);
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`  ok  ${obj.apiVersion} ${name(obj)}`);
  } catch (e) {
    problems.push(`${name(obj)}: ${e.message}`);
  }
}

// shardcoord's rules, beyond the schemas.
const workloads = objects.filter((o) => ["StatefulSet", "Deployment", "DaemonSet"].includes(o.kind));
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
for (const w of workloads) {
  const pod = w.spec.template;
  if (!matches(w.spec.selector.matchLabels, pod.metadata.labels)) {
    problems.push(`${name(w)}: selector does not match its pod labels`);
  }
  for (const c of pod.spec.containers) {
    const where = `${name(w)} container ${c.name}`;
    if (!c.resources?.requests || !c.resources?.limits?.memory) {
      problems.push(`${where}: needs resource requests and a memory limit`);
    }
    for (const probe of ["readinessProbe", "livenessProbe"]) {
      if (!c[probe]?.grpc) problems.push(`${where}: needs a gRPC ${probe}`);
    }
    // $(VAR) in env values must name a variable defined earlier in the list.
    const defined = new Set();
    for (const e of c.env ?? []) {
      for (const m of (e.value ?? "").matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
        if (!defined.has(m[1])) problems.push(`${where}: env ${e.name} uses $(${m[1]}) before it is defined`);
      }
      defined.add(e.name);
    }
    const ports = new Set((c.ports ?? []).map((p) => p.containerPort));
    for (const probe of ["readinessProbe", "livenessProbe", "startupProbe"]) {
      const port = c[probe]?.grpc?.port;
      if (port !== undefined && !ports.has(port)) problems.push(`${where}: ${probe} port ${port} is not a container port`);
    }
  }
  const podVolumes = new Set((pod.spec.volumes ?? []).map((v) => v.name));
  for (const t of w.spec.volumeClaimTemplates ?? []) podVolumes.add(t.metadata.name);
  for (const c of pod.spec.containers) {
    for (const m of c.volumeMounts ?? []) {
      if (!podVolumes.has(m.name)) problems.push(`${name(w)}: mount ${m.name} has no volume`);
    }
  }
}
const podLabels = workloads.map((w) => w.spec.template.metadata.labels);
for (const o of objects) {
  let selector;
  if (o.kind === "Service") selector = o.spec.selector;
  if (o.kind === "PodDisruptionBudget") selector = o.spec.selector?.matchLabels;
  if (o.kind === "NetworkPolicy") selector = o.spec.podSelector?.matchLabels;
  if (selector && !podLabels.some((l) => matches(selector, l))) {
    problems.push(`${name(o)}: selects no pod of these manifests`);
  }
}
for (const kind of ["StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy"]) {
  if (!objects.some((o) => o.kind === kind)) problems.push(`no ${kind} in the manifests`);
}

if (problems.length) {
  for (const p of problems) console.error(`  FAIL ${p}`);
  console.error(`${overlay}: ${problems.length} problems in ${objects.length} objects`);
  process.exit(1);
}
console.log(`${overlay}: ${objects.length} objects valid`);
