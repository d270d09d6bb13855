// Validate ServiceMonitor documents (a JSON array on stdin) against the prometheus-operator CRD
// schema, as compiled by @kubernetes-models/prometheus-operator. Prints one line per document,
// "ok <name>" or "error <name>: <reason>", and exits 1 if any document is invalid.
// The CRD schema, like the API server's, does not reject unknown fields: the Python test checks
// field names it relies on separately.
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";

let input = "";
for await (const chunk of process.stdin) input += chunk;
let failed = false;
for (const doc of JSON.parse(input)) {
  const name = doc?.metadata?.name ?? "?";
  try {
    new ServiceMonitor(doc).validate();
    console.log(`ok ${name}`);
  } catch (error) {
    failed = true;
    console.log(`error ${name}: ${error.message}`);
  }
}
process.exit(failed ? 1 : 0);
