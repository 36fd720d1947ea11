import java.util.List;
import java.util.Map;

import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetry;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.apache.kafka.server.telemetry.ClientTelemetryReceiver;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A broker metrics reporter that receives client telemetry (KIP-714). Kafka advertises
 * GetTelemetrySubscriptions and PushTelemetry only when a reporter in metric.reporters implements
 * ClientTelemetry; this one logs each push the broker hands it (client instance id, content type,
 * size), so the compatibility suite's telemetry scenarios run against Kafka as against pykbroker.
 */
public class CompatTelemetryReporter implements MetricsReporter, ClientTelemetry {
    private static final Logger LOG = LoggerFactory.getLogger(CompatTelemetryReporter.class);

    @Override
    public void configure(Map<String, ?> configs) {
    }

    @Override
    public void init(List<KafkaMetric> metrics) {
    }

    @Override
    public void metricChange(KafkaMetric metric) {
    }

    @Override
    public void metricRemoval(KafkaMetric metric) {
    }

    @Override
    public void close() {
    }

    @Override
    public ClientTelemetryReceiver clientReceiver() {
        return (AuthorizableRequestContext context, ClientTelemetryPayload payload) ->
            LOG.info("client telemetry from {} (client id {}): {} bytes of {}{}", payload.clientInstanceId(),
                context.clientId(), payload.data().remaining(), payload.contentType(),
                payload.isTerminating() ? ", terminating" : "");
    }
}
